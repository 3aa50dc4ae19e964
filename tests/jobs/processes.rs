//! Training across processes on cpu, for real: `train_llama` as 2 processes of 2 devices each,
//! launched with the variables torchrun sets, their groups meeting through a real etcd, their
//! gradients reduced between the processes by gloo. The losses must be those of one process
//! of 4 devices on the same global batch.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use neuron_pc_test_support::launch::{free_port, torchrun_vars};

use crate::etcd_support::Etcd;
use crate::llama_job::{self, command, tmp, Run, SMALL};

/// `train_llama all..` as `world` processes of one machine, each given what torchrun gives its
/// workers (run `run`, restart count `attempt`), the run's store at `etcd`; their output piped,
/// their errors without backtraces, as a user sees them. With `skip`, the collectives between
/// processes leave the other processes out (a test hook).
fn spawn_ranks(
    etcd: &Etcd,
    cache: &Path,
    run: &str,
    (world, attempt, skip): (usize, usize, bool),
    all: &[&str],
) -> Vec<Child> {
    let port = free_port();
    (0..world)
        .map(|rank| spawn_rank(etcd, cache, (run, port), (rank, world, attempt, skip), all))
        .collect()
}

/// Rank `rank` of [`spawn_ranks`], its master at `port`: `train_llama all..`.
fn spawn_rank(
    etcd: &Etcd,
    cache: &Path,
    (run, port): (&str, u16),
    (rank, world, attempt, skip): (usize, usize, usize, bool),
    all: &[&str],
) -> Child {
    let mut c = command(cache, all);
    c.envs(torchrun_vars(rank, world, run, port))
        .env("TORCHELASTIC_RESTART_COUNT", attempt.to_string())
        .env("NEURON_PC_STORE", &etcd.url)
        .env_remove("NEURON_PC_RUN_ID")
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE");
    if skip {
        c.env(neuron_pc::collectives::SKIP_ENV, "1");
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `train_llama SMALL.. args..` as `world` ranks ([`spawn_ranks`], attempt 0), each of which
/// must succeed.
fn launch(
    etcd: &Etcd,
    cache: &Path,
    run: &str,
    world: usize,
    args: &[&str],
    skip: bool,
) -> Vec<Run> {
    launch_attempt(etcd, cache, run, (world, 0, skip), args)
}

/// [`launch`] as `(world, attempt, skip)`.
fn launch_attempt(
    etcd: &Etcd,
    cache: &Path,
    run: &str,
    how: (usize, usize, bool),
    args: &[&str],
) -> Vec<Run> {
    let all = [SMALL, args].concat();
    spawn_ranks(etcd, cache, run, how, &all)
        .into_iter()
        .map(|c| llama_job::parse_output(c.wait_with_output().unwrap(), &all))
        .collect()
}

fn alone(cache: &Path, args: &[&str]) -> Run {
    let mut all: Vec<&str> = SMALL.to_vec();
    all.extend(args);
    llama_job::run_command(single(command(cache, &all)), &all)
}

/// A command that sees no launcher's variables (the test process may run under one).
fn single(mut c: Command) -> Command {
    for v in llama_job::LAUNCHER_VARS {
        c.env_remove(v);
    }
    c
}

fn assert_close(what: &str, got: &[(u64, f64)], want: &[(u64, f64)]) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for ((s, a), (t, b)) in got.iter().zip(want) {
        assert_eq!(s, t);
        let rel = (a - b).abs() / b.abs().max(1e-12);
        assert!(
            rel <= 1e-5,
            "{what}: step {s}: {a} vs {b} ({rel:e} relative)"
        );
    }
}

/// Each layout of 2 processes x 2 devices against one process of 4 devices: `(name, flags,
/// check the skip hook)`.
fn compare(tag: &str, layouts: &[(&str, &[&str], bool)]) {
    let Some(etcd) = Etcd::start(tag) else {
        return;
    };
    let cache = tmp(&format!("procs-{tag}"));
    let steps = ["--steps", "4", "--loss-log", "--peak-matmul", "0"];
    let four = alone(
        &cache,
        &[&steps[..], &["--devices", "4", "--json"]].concat(),
    );
    assert_eq!(four.losses.len(), 4);
    let state_bytes = |r: &Run| r.metrics["optimizer_state_bytes"].as_u64().unwrap();
    for &(name, flags, skip) in layouts {
        let args = [&steps[..], flags, &["--json"]].concat();
        if skip {
            // The same launch with the reduction between the processes left out (a test hook)
            // trains otherwise: the comparison below would catch a run that skipped it.
            let skipped = launch(&etcd, &cache, &format!("skip-{name}"), 2, &args, true);
            let differs = skipped[0]
                .losses
                .iter()
                .zip(&four.losses)
                .any(|((_, a), (_, b))| (a - b).abs() > 1e-4 * b.abs());
            assert!(
                differs,
                "{name}: {:?} vs {:?}",
                skipped[0].losses, four.losses
            );
        }
        let ranks = launch(&etcd, &cache, name, 2, &args, false);
        for (rank, r) in ranks.iter().enumerate() {
            assert_close(&format!("{name} rank {rank}"), &r.losses, &four.losses);
            assert_eq!(r.metrics["world_size"], 2, "{}", r.metrics);
            assert_eq!(r.metrics["rank"], rank, "{}", r.metrics);
            if name.contains("zero1") {
                // a device holds 1/4 of AdamW's moments (plus a block's padding), measured
                // from its buffers: its replica's, or its process's block split over its mesh
                let (held, whole) = (state_bytes(r), state_bytes(&four));
                assert!(
                    held * 4 >= whole && held as f64 <= 0.26 * whole as f64,
                    "{name}: {held} bytes of {whole}"
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(cache);
}

#[test]
fn data_parallel_over_two_processes_of_two_replicas_matches_one_process_of_four() {
    compare(
        "dp",
        &[
            ("dp", &["--devices", "2"], true),
            ("zero1", &["--devices", "2", "--zero1"], true),
        ],
    );
}

#[test]
fn a_mesh_in_each_of_two_processes_matches_one_process_of_four() {
    compare(
        "mesh",
        &[
            ("fsdp", &["--fsdp", "2"], true),
            ("tp", &["--tp", "2"], false),
            // NeuronX Distributed's layout: TP inside each process, ZeRO-1 across them
            ("tp-zero1", &["--tp", "2", "--zero1"], true),
            // the layers as one loop: on 2 cores its collectives inside the process once
            // starved those between processes of XLA's threads, and the second step hung
            ("fsdp-scan", &["--fsdp", "2", "--scan-layers"], false),
        ],
    );
}

/// `neuron-pc compile --world-size N --json -- train_llama SMALL.. args..` into `cache`.
fn precompile(cache: &Path, world: usize, args: &[&str]) -> serde_json::Value {
    llama_job::precompile_with(cache, &["--world-size", &world.to_string()], args)
}

#[test]
fn layouts_of_two_processes_and_of_one_precompiled_run_without_compiling() {
    let Some(etcd) = Etcd::start("aot") else {
        return;
    };
    let cache = tmp("procs-aot");
    let args = ["--steps", "3", "--peak-matmul", "0", "--devices", "2"];
    // the trial runs once as rank 0 of 2; then once as the single process of a restart
    let two = precompile(&cache, 2, &args);
    assert!(two["compiled"].as_u64().unwrap() >= 1, "{two}");
    let one = precompile(&cache, 1, &args);
    assert!(one["compiled"].as_u64().unwrap() >= 1, "{one}");
    let json = [&args[..], &["--json", "--loss-log"]].concat();
    for (rank, r) in launch(&etcd, &cache, "aot", 2, &json, false)
        .iter()
        .enumerate()
    {
        assert_eq!(r.metrics["compiles"], 0, "rank {rank}: {}", r.metrics);
        assert_eq!(r.losses.len(), 3);
    }
    let alone = alone(&cache, &json);
    assert_eq!(alone.metrics["compiles"], 0, "{}", alone.metrics);
    let _ = std::fs::remove_dir_all(cache);
}

#[test]
fn a_killed_rank_is_named_by_the_other_and_the_run_resumes_where_it_checkpointed() {
    use std::io::{BufRead, BufReader};
    let Some(etcd) = Etcd::start("kill") else {
        return;
    };
    let cache = tmp("procs-kill");
    let ckpt = cache.join("ckpt");
    let ckpt_args = ["--ckpt-dir", ckpt.to_str().unwrap(), "--ckpt-every", "4"];
    let base = ["--peak-matmul", "0", "--devices", "2", "--loss-log"];
    let mut all: Vec<&str> = SMALL.to_vec();
    all.extend(base);
    all.extend(ckpt_args);
    // killed long before its end; the first 10 steps are the warm-up, the same whatever the
    // run's length, so the resumed run of 14 steps below continues the same trajectory
    all.extend(["--steps", "100000"]);
    let mut ranks = spawn_ranks(&etcd, &cache, "kill", (2, 0, false), &all);
    // rank 1 is killed once it has passed the second checkpoint
    let out1 = BufReader::new(ranks[1].stdout.take().unwrap());
    for line in out1.lines() {
        let line = line.unwrap();
        if line.starts_with("{\"step\": 9,") {
            break;
        }
    }
    ranks[1].kill().unwrap();
    let killed = std::time::Instant::now();
    let _ = ranks[1].wait();
    let survivor = ranks.remove(0).wait_with_output().unwrap();
    let waited = killed.elapsed();
    let err = String::from_utf8_lossy(&survivor.stderr);
    assert!(!survivor.status.success());
    assert!(waited < std::time::Duration::from_secs(60), "{waited:?}");
    assert!(
        err.contains("lost rank 1 of 2 (gone from the run's store)"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    // the checkpoints the killed run left also resume at another world size: 1 process of 4
    let other = cache.join("ckpt-one");
    copy_dir(&ckpt, &other);
    let other_args = ["--ckpt-dir", other.to_str().unwrap(), "--ckpt-every", "4"];
    // a new attempt of the run (torchrun's restart count 1) resumes from the newest checkpoint
    let steps = ["--steps", "14", "--resume", "auto"];
    let args = [&base[..], &ckpt_args[..], &steps[..]].concat();
    let resumed = launch_attempt(&etcd, &cache, "kill", (2, 1, false), &args);
    let reference = alone(
        &cache,
        &[
            "--peak-matmul",
            "0",
            "--devices",
            "4",
            "--loss-log",
            "--steps",
            "14",
        ],
    );
    for (rank, r) in resumed.iter().enumerate() {
        assert!(
            r.stdout.contains("resumed from"),
            "rank {rank}: {}",
            r.stdout
        );
        let first = r.losses.first().map(|l| l.0).unwrap_or(0);
        assert!(
            (5..=10).contains(&first),
            "rank {rank} resumed at step {first}"
        );
        let tail: Vec<(u64, f64)> = reference
            .losses
            .iter()
            .filter(|(s, _)| *s >= first)
            .copied()
            .collect();
        assert_close(&format!("resumed rank {rank}"), &r.losses, &tail);
    }
    let one = ["--peak-matmul", "0", "--devices", "4", "--loss-log"];
    let r = alone(&cache, &[&one[..], &other_args[..], &steps[..]].concat());
    let first = r.losses.first().map(|l| l.0).unwrap_or(0);
    assert!((5..=10).contains(&first), "1 x 4 resumed at step {first}");
    let tail: Vec<(u64, f64)> = (reference.losses.iter())
        .filter(|(s, _)| *s >= first)
        .copied()
        .collect();
    assert_close("resumed by 1 process of 4", &r.losses, &tail);
    let _ = std::fs::remove_dir_all(cache);
}

#[test]
fn a_batch_that_does_not_split_over_every_process_is_one_line_on_each_rank() {
    let Some(etcd) = Etcd::start("bad") else {
        return;
    };
    let cache = tmp("procs-bad");
    for (name, flags, needle) in [
        // 2 processes x 2 replicas: 4 replicas in the run
        (
            "replicas",
            &["--devices", "2", "--batch-size", "6"][..],
            "--batch-size 6 does not split over 4 replica(s)",
        ),
        // a mesh of 2 in each of 2 processes
        (
            "mesh",
            &["--fsdp", "2", "--batch-size", "6"][..],
            "--batch-size 6 does not split over --fsdp 2 x 2 processes",
        ),
    ] {
        let mut all: Vec<&str> = vec!["--hidden", "32", "--intermediate", "64", "--steps", "2"];
        all.extend(flags);
        let ranks = spawn_ranks(&etcd, &cache, &format!("bad-{name}"), (2, 0, false), &all);
        for (rank, child) in ranks.into_iter().enumerate() {
            let out = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{name} rank {rank} ran");
            let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
            assert_eq!(lines.len(), 1, "{name} rank {rank}: {err}");
            assert!(lines[0].contains(needle), "{name} rank {rank}: {err}");
        }
    }
    let _ = std::fs::remove_dir_all(cache);
}

#[test]
fn ranks_that_disagree_on_their_devices_stop_before_step_1_with_one_line_each() {
    let Some(etcd) = Etcd::start("layout") else {
        return;
    };
    let cache = tmp("procs-layout");
    let port = free_port();
    // rank 0 lays a tensor-parallel mesh over its 2 devices, rank 1 two data-parallel replicas
    let flags = [["--tp", "2"], ["--devices", "2"]];
    let ranks: Vec<Child> = (0..2)
        .map(|rank| {
            let all = [SMALL, &flags[rank][..], &["--steps", "2"]].concat();
            spawn_rank(&etcd, &cache, ("layout", port), (rank, 2, 0, false), &all)
        })
        .collect();
    for (rank, child) in ranks.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "rank {rank} ran");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "rank {rank}: {err}");
        assert!(
            lines[0].contains(concat!(
                "the ranks' devices disagree (rank 0: a mesh of (data 1, model 2); ",
                "rank 1: 2 device(s))"
            )),
            "rank {rank}: {err}"
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            !stdout.contains("\"step\""),
            "rank {rank} stepped: {stdout}"
        );
    }
    let _ = std::fs::remove_dir_all(cache);
}

/// The tensor names in a safetensors file's header.
fn safetensors_names(path: &Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    header
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect()
}

/// What a resume says it read: (MiB read, MiB in the checkpoint, the share in percent).
fn resume_read(stdout: &str) -> (f64, f64, f64) {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("resume read "))
        .unwrap_or_else(|| panic!("no resume line: {stdout}"));
    let words: Vec<&str> = line.split(' ').collect();
    let pct = words[7].trim_start_matches('(').split('%').next().unwrap();
    let number = |w: &str| {
        w.parse::<f64>()
            .unwrap_or_else(|_| panic!("{w:?} in {line}"))
    };
    (number(words[0]), number(words[5]), number(pct))
}

/// A copy of checkpoint directory `from` at `to` (each resume below starts from the same saves).
pub(crate) fn copy_dir(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-r")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn checkpoints_move_between_two_processes_and_one_process_of_any_size() {
    let Some(etcd) = Etcd::start("world") else {
        return;
    };
    let cache = tmp("procs-world");
    // 8 steps saved every 4, then resumed to 12: the warm-up is 10 steps whatever the run's
    // length, so the first 8 are the same in a run of 8 and in one of 12
    let save = |dir: &Path| {
        [
            "--ckpt-dir".to_string(),
            dir.display().to_string(),
            "--ckpt-every".into(),
            "4".into(),
        ]
    };
    let steps = ["--peak-matmul", "0", "--loss-log"];
    let reference = alone(
        &cache,
        &[&steps[..], &["--devices", "4", "--steps", "12"]].concat(),
    );
    let check = |what: &str, r: &Run, dir: &Path| {
        assert!(
            r.stdout.contains(&format!(
                "resumed from {}",
                dir.join("step-00000008").display()
            )),
            "{what}: {}",
            r.stdout
        );
        let tail: Vec<(u64, f64)> = reference.losses[8..].to_vec();
        assert_close(what, &r.losses, &tail);
    };
    // saved by 2 processes (DP 2 x 2, ZeRO-1 over the 4, DP 2 x TP 2, and TP 2 with ZeRO-1 over
    // the 2 processes), resumed by one of 4 devices and of 1
    for (name, flags) in [
        ("dp", &["--devices", "2"][..]),
        ("zero1", &["--devices", "2", "--zero1"][..]),
        ("tp", &["--tp", "2"][..]),
        ("tp-zero1", &["--tp", "2", "--zero1"][..]),
    ] {
        // the blocks of AdamW's moments each rank holds: its 2 replicas' of 4, or its own of 2
        let blocks = match name {
            "zero1" => Some([["#0", "#1"], ["#2", "#3"]]),
            "tp-zero1" => Some([["#0", "#0"], ["#1", "#1"]]),
            _ => None,
        };
        let dir = cache.join(format!("ckpt-{name}"));
        let s = save(&dir);
        let s: Vec<&str> = s.iter().map(String::as_str).collect();
        let args = [&steps[..], flags, &s[..], &["--steps", "8"]].concat();
        launch(&etcd, &cache, &format!("world-{name}"), 2, &args, false);
        if let Some(blocks) = blocks {
            // each rank wrote only its blocks of AdamW's moments
            let step = dir.join("step-00000008");
            for (rank, mine) in blocks.into_iter().enumerate() {
                let names = safetensors_names(
                    &step.join(format!("rank-0000{rank}-model-00001-of-00001.safetensors")),
                );
                let moments: Vec<&String> =
                    names.iter().filter(|n| n.contains(".exp_avg")).collect();
                assert!(!moments.is_empty(), "rank {rank}: {names:?}");
                for n in &moments {
                    assert!(mine.iter().any(|m| n.ends_with(m)), "rank {rank} wrote {n}");
                }
                // the replicated parameters (and the step count) are rank 0's to write
                let params = names.iter().filter(|n| !n.contains(".exp_avg")).count();
                assert_eq!(params > 0, rank == 0, "rank {rank}: {names:?}");
            }
        }
        for (target, devices) in [("4 devices", "4"), ("1 device", "1")] {
            let copy = cache.join(format!("ckpt-{name}-{devices}"));
            copy_dir(&dir, &copy);
            let s = save(&copy);
            let s: Vec<&str> = s.iter().map(String::as_str).collect();
            let resume = ["--devices", devices, "--steps", "12", "--resume", "auto"];
            let r = alone(&cache, &[&steps[..], &s[..], &resume[..]].concat());
            check(&format!("2 x {name} -> 1 x {target}"), &r, &copy);
            // one process holds the whole state: it reads all of it
            let (read, state, _) = resume_read(&r.stdout);
            assert_eq!(read, state, "2 x {name} -> 1 x {target}: {}", r.stdout);
        }
        if blocks.is_some() {
            // resumed by 2 processes of ZeRO-1 again: each reads the parameters and only its
            // blocks of the moments (2/3 of AdamW's state), never the whole
            let copy = cache.join(format!("ckpt-{name}-again"));
            copy_dir(&dir, &copy);
            let s = save(&copy);
            let s: Vec<&str> = s.iter().map(String::as_str).collect();
            let resume = ["--steps", "12", "--resume", "auto"];
            let args = [&steps[..], flags, &s[..], &resume[..]].concat();
            let run = format!("world-{name}-again");
            let ranks = launch(&etcd, &cache, &run, 2, &args, false);
            for (rank, r) in ranks.iter().enumerate() {
                check(&format!("2 x {name} -> 2 x {name}, rank {rank}"), r, &copy);
                let (_, _, share) = resume_read(&r.stdout);
                assert!((60.0..70.0).contains(&share), "rank {rank}: {}", r.stdout);
            }
        }
    }
    // saved by one process of 4 devices, resumed by 2 processes of 2
    let dir = cache.join("ckpt-one");
    let s = save(&dir);
    let s: Vec<&str> = s.iter().map(String::as_str).collect();
    alone(
        &cache,
        &[&steps[..], &s[..], &["--devices", "4", "--steps", "8"]].concat(),
    );
    let resume = ["--devices", "2", "--steps", "12", "--resume", "auto"];
    let ranks = launch(
        &etcd,
        &cache,
        "world-up",
        2,
        &[&steps[..], &s[..], &resume[..]].concat(),
        false,
    );
    for (rank, r) in ranks.iter().enumerate() {
        check(&format!("1 x 4 -> 2 x 2, rank {rank}"), r, &dir);
    }
    let _ = std::fs::remove_dir_all(cache);
}
