//! NEURON_CC_FLAGS parsing: accepted spellings, refused input, overlay order, cache-key fields.

use neuron_pc_compiler::flags::{
    is_neuron, split_words, AutoCast, AutoCastType, CompilerFlags, FlagOverrides, ModelType,
    OptLevel, Target,
};
use neuron_pc_compiler::Error;
use neuron_pc_test_support::process::run_alone;

fn flags(
    target: Target,
    opt_level: OptLevel,
    auto_cast: AutoCast,
    auto_cast_type: AutoCastType,
    model_type: ModelType,
) -> CompilerFlags {
    CompilerFlags {
        target,
        opt_level,
        auto_cast,
        auto_cast_type,
        model_type,
        retry_failed: false,
        cache_dir: None,
        neuron: Default::default(),
    }
}

#[test]
fn defaults() {
    let d = CompilerFlags::default();
    assert_eq!(
        d,
        flags(
            Target::Cpu,
            OptLevel::O2,
            AutoCast::None,
            AutoCastType::Bf16,
            ModelType::Generic
        )
    );
    assert_eq!(CompilerFlags::parse("").unwrap(), d);
    assert_eq!(CompilerFlags::parse("   \t\n ").unwrap(), d);
}

#[test]
fn accepted_spellings() {
    use AutoCast as A;
    use AutoCastType as T;
    use ModelType as M;
    use OptLevel::*;
    use Target::*;
    let cases: &[(&str, CompilerFlags)] = &[
        (
            "--target trn1 --auto-cast all --auto-cast-type bf16 --model-type transformer \
             --optlevel O1",
            flags(Trn1, O1, A::All, T::Bf16, M::Transformer),
        ),
        ("--optlevel 3", flags(Cpu, O3, A::None, T::Bf16, M::Generic)),
        (
            "--optlevel=O1",
            flags(Cpu, O1, A::None, T::Bf16, M::Generic),
        ),
        (
            "--optlevel o3",
            flags(Cpu, O3, A::None, T::Bf16, M::Generic),
        ),
        ("-O1", flags(Cpu, O1, A::None, T::Bf16, M::Generic)),
        ("-O 3", flags(Cpu, O3, A::None, T::Bf16, M::Generic)),
        (
            "-O3 --optlevel 2",
            flags(Cpu, O2, A::None, T::Bf16, M::Generic),
        ),
        (
            "--target=cuda",
            flags(Cuda, O2, A::None, T::Bf16, M::Generic),
        ),
        // Neuron's default auto-cast on Trainium is matmult.
        (
            "--target trn2",
            flags(Trn2, O2, A::Matmult, T::Bf16, M::Generic),
        ),
        (
            "--target=trn1 --auto-cast=none",
            flags(Trn1, O2, A::None, T::Bf16, M::Generic),
        ),
        (
            "--auto_cast matmult --auto_cast_type fp16",
            flags(Cpu, O2, A::Matmult, T::Fp16, M::Generic),
        ),
        (
            "--auto-cast-type=FP16",
            flags(Cpu, O2, A::None, T::Fp16, M::Generic),
        ),
        (
            "--model_type=transformer",
            flags(Cpu, O2, A::None, T::Bf16, M::Transformer),
        ),
        // Repeats: the last one wins, as with Neuron's argparse.
        (
            "--target cpu --target trn1",
            flags(Trn1, O2, A::Matmult, T::Bf16, M::Generic),
        ),
        (
            "  --optlevel\t1\n",
            flags(Cpu, O1, A::None, T::Bf16, M::Generic),
        ),
    ];
    for (input, want) in cases {
        let got = CompilerFlags::parse(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
        assert_eq!(&got, want, "{input:?}");
    }
}

#[test]
fn switches_and_paths() {
    let cases: &[(&str, bool, Option<&str>)] = &[
        ("--retry_failed_compilation", true, None),
        ("--retry-failed-compilation", true, None),
        ("--retry_failed_compilation=false", false, None),
        ("--retry_failed_compilation=TRUE --optlevel 1", true, None),
        ("--cache_dir /var/tmp/cache", false, Some("/var/tmp/cache")),
        (
            "--cache-dir=s3://bucket/prefix",
            false,
            Some("s3://bucket/prefix"),
        ),
        (
            "--cache_dir '/tmp/my cache' --retry_failed_compilation",
            true,
            Some("/tmp/my cache"),
        ),
        (
            r#"--cache_dir="/tmp/a \"b\"""#,
            false,
            Some(r#"/tmp/a "b""#),
        ),
        (r"--cache_dir /tmp/x\ y", false, Some("/tmp/x y")),
    ];
    for (input, retry, dir) in cases {
        let got = CompilerFlags::parse(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
        assert_eq!(got.retry_failed, *retry, "{input:?}");
        assert_eq!(got.cache_dir.as_deref(), *dir, "{input:?}");
        assert_eq!(
            got.opt_level,
            if input.contains("optlevel 1") {
                OptLevel::O1
            } else {
                OptLevel::O2
            }
        );
    }
}

#[test]
fn refused_input_names_the_problem_and_the_supported_set() {
    // (input, text the one-line message must contain)
    let cases: &[(&str, &[&str])] = &[
        (
            "--frobnicate",
            &["unknown flag \"--frobnicate\"", "supported flags: --target"],
        ),
        (
            "--log-file=/tmp/x",
            &["unknown flag \"--log-file\"", "--cache_dir", "--logfile"],
        ),
        (
            "--distribution-strategy banana",
            &["\"banana\" is not supported", "llm-training, nemo"],
        ),
        (
            "--enable-saturate-infinity=yes",
            &["--enable-saturate-infinity takes no value"],
        ),
        ("--logfile", &["--logfile needs a value"]),
        ("-lnc 3", &["\"3\" is not supported", "1, 2"]),
        ("---target cpu", &["unknown flag", "supported flags"]),
        ("trn1", &["unexpected argument \"trn1\"", "supported flags"]),
        ("-target cpu", &["unexpected argument \"-target\""]),
        ("--target", &["--target needs a value", "supported flags"]),
        ("--target --optlevel 1", &["--target needs a value"]),
        ("--target=", &["empty value"]),
        (
            "--target inf1",
            &["\"inf1\" is not supported", "cpu, cuda, trn1, trn2"],
        ),
        (
            "--auto-cast-type tf32",
            &["\"tf32\" is not supported", "bf16, fp16"],
        ),
        ("--auto-cast-type fp8_e4m3", &["bf16, fp16"]),
        ("--auto-cast some", &["none, matmult, all"]),
        ("--model-type unet-inference", &["generic, transformer"]),
        ("--optlevel 4", &["\"4\" is not supported", "1, 2, 3"]),
        ("--optlevel O0", &["1, 2, 3"]),
        ("-O4", &["-O \"4\""]),
        ("-O", &["-O needs a level"]),
        (
            "--retry_failed_compilation=maybe",
            &["\"maybe\" is not supported", "true, false"],
        ),
        ("--optlevel 1 extra", &["unexpected argument \"extra\""]),
        ("--cache_dir '/tmp/x", &["unterminated ' quote"]),
        ("--cache_dir \"/tmp/x", &["unterminated \" quote"]),
        ("--cache_dir x\\", &["trailing backslash"]),
    ];
    for (input, needles) in cases {
        match CompilerFlags::parse(input) {
            Err(Error::Flag { message }) => {
                assert!(
                    !message.contains('\n'),
                    "{input:?}: message spans lines: {message}"
                );
                for n in *needles {
                    assert!(message.contains(n), "{input:?}: {message:?} lacks {n:?}");
                }
            }
            other => panic!("{input:?} should be refused, got {other:?}"),
        }
    }
}

#[test]
fn command_line_overrides_env_flag_by_flag() {
    let env = FlagOverrides::parse(
        "--target trn1 --optlevel 1 --auto-cast all --cache_dir /env --retry_failed_compilation",
    )
    .unwrap();
    let cli = FlagOverrides::parse_args(&["--optlevel=3", "--cache-dir", "/cli"]).unwrap();
    let f = env.overlay(&cli).resolve();
    assert_eq!(f.target, Target::Trn1, "kept from env");
    assert_eq!(f.opt_level, OptLevel::O3, "command line wins");
    assert_eq!(f.auto_cast, AutoCast::All, "kept from env");
    assert_eq!(f.cache_dir.as_deref(), Some("/cli"));
    assert!(f.retry_failed);

    // Defaults are filled after the overlay: a target set on the command line decides the
    // auto-cast default even if the env named another target.
    let env = FlagOverrides::parse("--target cpu").unwrap();
    let cli = FlagOverrides::parse("--target trn2").unwrap();
    assert_eq!(env.overlay(&cli).resolve().auto_cast, AutoCast::Matmult);
    assert_eq!(cli.overlay(&env).resolve().auto_cast, AutoCast::None);
}

#[test]
fn from_env_reads_neuron_cc_flags() {
    // alone in a process of its own: it sets NEURON_CC_FLAGS, which other tests read
    if !run_alone(module_path!(), "from_env_reads_neuron_cc_flags") {
        return;
    }
    // Only this test touches the variable; integration test files are separate processes but
    // tests within one file share it, so set and read in one place.
    std::env::set_var("NEURON_CC_FLAGS", "--optlevel 1 --target cuda");
    let f = CompilerFlags::from_env().unwrap();
    assert_eq!((f.target, f.opt_level), (Target::Cuda, OptLevel::O1));
    let cli = FlagOverrides::parse("-O3").unwrap();
    let f = CompilerFlags::from_env_and(&cli).unwrap();
    assert_eq!((f.target, f.opt_level), (Target::Cuda, OptLevel::O3));
    std::env::set_var("NEURON_CC_FLAGS", "--bogus");
    let err = CompilerFlags::from_env().unwrap_err().to_string();
    assert!(err.starts_with("NEURON_CC_FLAGS: unknown flag"), "{err}");
    std::env::remove_var("NEURON_CC_FLAGS");
    assert_eq!(CompilerFlags::from_env().unwrap(), CompilerFlags::default());
}

#[test]
fn key_fields_cover_every_executable_changing_flag() {
    let base = CompilerFlags::default();
    let names: Vec<&str> = base.key_fields().iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "target",
            "optlevel",
            "auto_cast",
            "auto_cast_type",
            "model_type"
        ]
    );
    assert_eq!(
        base.key_fields()
            .iter()
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>(),
        ["cpu", "2", "none", "bf16", "generic"]
    );
    // Each executable-changing flag alone changes the key fields...
    for change in [
        "--target cuda",
        "--optlevel 1",
        "--optlevel 3",
        "--auto-cast matmult",
        "--auto-cast all",
        "--auto-cast-type fp16",
        "--model-type transformer",
    ] {
        let f = CompilerFlags::parse(change).unwrap();
        assert_ne!(f.key_fields(), base.key_fields(), "{change}");
    }
    // ...and the two that only steer the cache do not.
    for same in ["--retry_failed_compilation", "--cache_dir /elsewhere"] {
        let f = CompilerFlags::parse(same).unwrap();
        assert_ne!(f, base);
        assert_eq!(f.key_fields(), base.key_fields(), "{same}");
    }
}

#[test]
fn neuron_args_carry_optlevel_and_casts() {
    let f = CompilerFlags::parse(
        "--target trn1 -O3 --auto-cast all --auto-cast-type fp16 --model-type transformer \
         --cache_dir /c --retry_failed_compilation",
    )
    .unwrap();
    assert_eq!(
        f.to_neuron_args(),
        [
            "--target",
            "trn1",
            "--optlevel",
            "3",
            "--auto-cast",
            "all",
            "--auto-cast-type",
            "fp16",
            "--model-type",
            "transformer"
        ]
    );
    // The default trn auto-cast is handed over explicitly, so Neuron and the key agree.
    let f = CompilerFlags::parse("--target trn2").unwrap();
    let args = f.to_neuron_args();
    let at = args.iter().position(|a| a == "--auto-cast").unwrap();
    assert_eq!(args[at + 1], "matmult");
    assert!(is_neuron(f.target) && !is_neuron(Target::Cpu) && !is_neuron(Target::Cuda));
}

#[test]
fn display_parses_back_to_the_same_flags() {
    for input in [
        "",
        "--target trn2 -O1 --auto-cast all --auto-cast-type fp16 --model-type transformer",
        "--cache_dir '/tmp/it'\\''s here' --retry_failed_compilation --optlevel 3",
        "--cache_dir s3://b/p",
    ] {
        let f = CompilerFlags::parse(input).unwrap();
        let printed = f.to_string();
        assert_eq!(
            CompilerFlags::parse(&printed).unwrap(),
            f,
            "{input:?} -> {printed:?}"
        );
    }
}

#[test]
fn word_splitting() {
    let cases: &[(&str, &[&str])] = &[
        ("a b  c", &["a", "b", "c"]),
        ("'a b' c", &["a b", "c"]),
        ("\"a\\\"b\" 'c\\d'", &["a\"b", "c\\d"]),
        ("x'y'\"z\"", &["xyz"]),
        ("''", &[""]),
        ("", &[]),
    ];
    for (input, want) in cases {
        assert_eq!(split_words(input).unwrap(), *want, "{input:?}");
    }
}

/// Real `neuronx-cc` flags from Neuron training setups are accepted; on trn they reach Neuron's
/// compiler, and the code-changing ones enter the key there; on cpu none of them does.
#[test]
fn neuronx_cc_flags_pass_through_to_neuron_and_into_its_keys() {
    let real = "--model-type=transformer --distribution-strategy=llm-training \
                --enable-saturate-infinity --enable-mixed-precision-accumulation \
                --logfile /tmp/neuron.log --framework XLA -lnc 2 --enable-fast-context-switch \
                --enable-fast-loading-neuron-binaries --verbose info --workdir /tmp/w";
    let cpu = CompilerFlags::parse(real).unwrap();
    let trn = CompilerFlags::parse(&format!("{real} --target trn1")).unwrap();
    // Display parses back, pass-through flags included (the AOT job gets them this way).
    for f in [&cpu, &trn] {
        assert_eq!(&CompilerFlags::parse(&f.to_string()).unwrap(), f, "{f}");
    }
    // NEMO is an alias spelled in capitals in Neuron's docs.
    assert_eq!(
        CompilerFlags::parse("--distribution-strategy NEMO --target trn1")
            .unwrap()
            .key_fields()
            .last()
            .unwrap(),
        &("neuron.distribution_strategy", "nemo".to_string())
    );

    let args = trn.to_neuron_args();
    for want in [
        "--distribution-strategy",
        "llm-training",
        "--enable-saturate-infinity",
        "--logfile",
        "/tmp/neuron.log",
        "--logical-nc-config",
        "2",
    ] {
        assert!(
            args.iter().any(|a| a == want),
            "{want} missing from {args:?}"
        );
    }

    // On trn each code-changing flag alone changes the key fields; the others do not.
    let base = CompilerFlags::parse("--target trn1").unwrap();
    for change in [
        "--distribution-strategy llm-training",
        "--distribution-strategy nemo",
        "--logical-nc-config 1",
        "-lnc=2",
        "--enable-mixed-precision-accumulation",
        "--enable-saturate-infinity",
        "--enable-fast-context-switch",
        "--enable-fast-loading-neuron-binaries",
    ] {
        let f = CompilerFlags::parse(&format!("--target trn1 {change}")).unwrap();
        assert_ne!(f.key_fields(), base.key_fields(), "{change}");
    }
    for same in [
        "--logfile x.log",
        "--framework XLA",
        "--verbose debug",
        "--workdir /w",
    ] {
        let f = CompilerFlags::parse(&format!("--target trn1 {same}")).unwrap();
        assert_ne!(f, base);
        assert_eq!(f.key_fields(), base.key_fields(), "{same}");
        assert!(
            f.to_neuron_args().len() > base.to_neuron_args().len(),
            "{same}"
        );
    }
    // On cpu they mean nothing: the key is the plain cpu key.
    assert_eq!(
        cpu.key_fields(),
        CompilerFlags::parse("--model-type transformer")
            .unwrap()
            .key_fields()
    );
    // Later words win, flag by flag, across sources.
    let env =
        FlagOverrides::parse("--distribution-strategy nemo --enable-saturate-infinity").unwrap();
    let cli = FlagOverrides::parse("--distribution-strategy llm-training --target trn2").unwrap();
    let f = env.overlay(&cli).resolve();
    let k = f.key_fields();
    assert!(
        k.contains(&("neuron.distribution_strategy", "llm-training".into())),
        "{k:?}"
    );
    assert!(
        k.contains(&("neuron.enable_saturate_infinity", "on".into())),
        "{k:?}"
    );
}

#[test]
fn neuron_flags_on_cpu_are_named_once_per_process() {
    let f = CompilerFlags::parse("--enable-saturate-infinity --logfile /tmp/l").unwrap();
    let first = f.warn_unused_neuron_flags();
    assert_eq!(first, ["--enable-saturate-infinity", "--logfile"]);
    assert!(f.warn_unused_neuron_flags().is_empty(), "warned twice");
    let trn = CompilerFlags::parse("--target trn1 --enable-fast-context-switch").unwrap();
    assert!(
        trn.warn_unused_neuron_flags().is_empty(),
        "meaningful on trn"
    );
}
