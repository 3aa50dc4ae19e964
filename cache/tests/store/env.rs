//! Configuration from the environment. One test in its own binary: it changes the process
//! environment, which must not race with other tests.

use crate::common;
use neuron_pc_test_support::process::run_alone;

use common::*;
use neuron_pc_cache::{default_dir, Cache, CacheOptions, Error, Lookup, PutOutcome};

#[test]
fn environment_variables_configure_the_cache() {
    // alone in a process of its own: it sets the cache's variables, which other tests' caches read
    if !run_alone(module_path!(), "environment_variables_configure_the_cache") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("XDG_CACHE_HOME", dir.path().join("xdg"));
    assert_eq!(default_dir(), dir.path().join("xdg").join("neuron-pc"));
    for v in [
        "NEURON_COMPILE_CACHE_URL",
        "NEURON_PC_CACHE_READ_ONLY",
        "NEURON_PC_CACHE_MAX_SIZE",
        "NEURON_PC_CACHE_SIGNING_KEY",
    ] {
        std::env::remove_var(v);
    }
    // No URL: the default directory.
    let k = key("env");
    let c = Cache::from_env(opts()).unwrap();
    assert_eq!(
        c.put(&k, &exe_for(&k, 10), "", &inputs("e"), 1.0),
        PutOutcome::Stored
    );
    assert!(default_dir().join(record_obj(&k)).exists());

    // A URL, a signing key, a size bound and read-only mode.
    let url = dir.path().join("shared");
    std::env::set_var(
        "NEURON_COMPILE_CACHE_URL",
        format!("file://{}", url.display()),
    );
    std::env::set_var("NEURON_PC_CACHE_SIGNING_KEY", "secret");
    std::env::set_var("NEURON_PC_CACHE_MAX_SIZE", "2K");
    let o = CacheOptions::from_env().unwrap();
    assert_eq!(
        (o.max_local_bytes, o.signing_key.as_deref()),
        (Some(2048), Some(&b"secret"[..]))
    );
    let c = Cache::from_env(opts()).unwrap();
    assert_eq!(
        c.put(&k, &exe_for(&k, 10), "", &inputs("e"), 1.0),
        PutOutcome::Stored
    );
    assert!(
        url.join(record_obj(&k)).exists(),
        "the URL from the environment is used"
    );
    let unsigned = Cache::open(url.to_str().unwrap(), opts()).unwrap();
    let rec = unsigned.record(&k).unwrap().0;
    assert!(rec.signature.is_some(), "written with the signing key");
    std::env::set_var("NEURON_PC_CACHE_READ_ONLY", "1");
    let ro = Cache::from_env(opts()).unwrap();
    assert!(ro.options().read_only);
    assert!(matches!(ro.get(&k), Lookup::Hit(_)));
    assert_eq!(
        ro.put(&key("env 2"), &[1], "", &inputs("e"), 1.0),
        PutOutcome::ReadOnly
    );
    std::env::set_var("NEURON_PC_CACHE_READ_ONLY", "0");
    assert!(!CacheOptions::from_env().unwrap().read_only);

    // Bad values are errors, not silently ignored.
    std::env::set_var("NEURON_PC_CACHE_MAX_SIZE", "lots");
    assert!(matches!(
        CacheOptions::from_env(),
        Err(Error::InvalidUrl { .. })
    ));
    std::env::remove_var("NEURON_PC_CACHE_MAX_SIZE");
    std::env::set_var("NEURON_PC_CACHE_S3_TIMEOUT", "-1");
    assert!(CacheOptions::from_env().is_err());
    std::env::remove_var("NEURON_PC_CACHE_S3_TIMEOUT");
    std::env::set_var("NEURON_COMPILE_CACHE_URL", "gs://bucket/x");
    assert!(matches!(
        Cache::from_env(opts()),
        Err(Error::InvalidUrl { .. })
    ));
}
