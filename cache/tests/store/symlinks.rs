//! Issue 23 item 1: no operation follows a symlink out of the cache root. Each directory of
//! the layout (`entries/`, `entries/<shard>/`, `failures/`, `locks/`) in turn is a link to a
//! directory outside the cache that holds files named like the objects the cache would touch
//! there; a job (lookup, lease, compile, put, failure record) and every maintenance call run,
//! and the outside files must come out byte for byte as they went in, with nothing added.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;
use neuron_pc_cache::{Cache, EntryKey, Obtained};

/// The layout directories, as paths relative to the root, for an entry of `k`.
fn layout_dirs(k: &EntryKey) -> Vec<String> {
    vec![
        "entries".into(),
        format!("entries/{}", &k.as_str()[..2]),
        "failures".into(),
        "locks".into(),
    ]
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.clone(), std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    out
}

/// Fills `outside` with what the linked directory `rel` would hold for `k` and `failed`
/// (records, programs, executables, failure records, locks), as a victim's own files.
fn plant_victims(outside: &Path, rel: &str, k: &EntryKey, failed: &EntryKey, exe: &[u8]) {
    let mut names = Vec::new();
    for key in [k, failed] {
        names.extend([
            record_obj(key),
            program_obj(key),
            exe_obj(key, exe),
            failure_obj(key),
            lock_obj(key),
        ]);
    }
    for name in names {
        let Some(inside) = name.strip_prefix(&format!("{rel}/")) else {
            continue;
        };
        let p = outside.join(inside);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, format!("victim's own file {inside}")).unwrap();
    }
}

/// A job and every maintenance call against a cache whose layout directory `rel` is a link
/// out of the root: the job still gets its executable, the outside files are untouched.
fn run_everything(root: &Path, k: &EntryKey, failed: &EntryKey, exe: &[u8]) {
    let c = Cache::open(root.to_str().unwrap(), opts()).unwrap();
    // A job: lookup, lease, compile, store; a compile that fails records its failure.
    let got = c
        .get_or_compile(k, "prog", &inputs("s"), false, || Ok(exe.to_vec()))
        .expect("a broken cache never breaks the job");
    match got {
        Obtained::Compiled { executable, .. } => assert_eq!(executable, exe),
        Obtained::Hit(h) | Obtained::Waited(h) => assert_eq!(h.executable, exe),
    }
    let r = c.get_or_compile(failed, "prog", &inputs("f"), true, || Err("no".into()));
    assert!(r.is_err(), "the compile failure is the job's error");
    c.put(k, exe, "prog", &inputs("s"), 1.0);
    c.replace(k, exe, "prog", &inputs("s"), 1.0);
    let _ = c.get(k);
    let _ = c.get(failed);
    let _ = c.program(k);
    let _ = c.record(k);
    let _ = c.failure(failed);
    let _ = c.check(k);
    // Maintenance: errors are allowed (a refused link is an error), following it is not.
    let _ = c.list();
    let _ = c.stats();
    let _ = c.resolve(&k.as_str()[..6]);
    let _ = c.verify(false);
    let _ = c.remove(k);
    let _ = c.remove(failed);
    let _ = c.prune(0);
    let _ = c.clear(true);
    let _ = c.clear(false);
    let _ = c.verify(true);
}

#[test]
fn no_operation_follows_a_layout_directory_linked_out_of_the_root() {
    let k = key("symlinked layout");
    let failed = key("symlinked layout, failed compile");
    let exe = exe_for(&k, 500);
    for rel in layout_dirs(&k) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        plant_victims(&outside, &rel, &k, &failed, &exe);
        let before = snapshot(&outside);
        assert!(!before.is_empty(), "{rel}: victims planted");
        let link = root.join(&rel);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&outside, &link).unwrap();

        run_everything(&root, &k, &failed, &exe);

        assert_eq!(
            snapshot(&outside),
            before,
            "{rel} a link out of the root: the files it points to are untouched"
        );
    }
    fault_report(
        "layout directory a symlink out of the root",
        4,
        "job and maintenance refuse the link; outside untouched",
        0,
        0,
    );
}
