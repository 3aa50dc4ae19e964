//! SIGKILL during background checkpoint saves (`examples/train_llama --ckpt-dir`), on a local
//! directory and on S3 (the loopback server): every resume continues from the newest complete
//! checkpoint with exactly the uninterrupted run's losses, and never needs to fall back past a
//! torn one. The test kills at a few points; `scripts/ckpt-kill-sweep` runs the sweep of random
//! kill moments over 50 saves on each (the ignored test `kill_sweep`).

use crate::llama_job;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use llama_job::{command, run, tmp, SMALL};
use neuron_pc_test_support::s3::{moto, new_bucket, Moto};

/// Where the checkpoints go, and what the job's environment needs for it.
enum Place {
    Local(PathBuf),
    S3 { url: String, endpoint: String },
}

impl Place {
    fn apply(&self, c: &mut Command) {
        match self {
            Place::Local(dir) => {
                c.args(["--ckpt-dir", dir.to_str().unwrap()]);
            }
            Place::S3 { url, endpoint } => {
                c.args(["--ckpt-dir", url])
                    .env("AWS_ENDPOINT_URL", endpoint)
                    .env("AWS_ACCESS_KEY_ID", "testing")
                    .env("AWS_SECRET_ACCESS_KEY", "testing")
                    .env("AWS_REGION", "us-east-1")
                    .env_remove("AWS_PROFILE");
            }
        }
    }
}

fn s3_place(m: &Moto, tag: &str) -> Place {
    Place::S3 {
        url: format!("s3://{}/run", new_bucket(m, tag)),
        endpoint: m.endpoint(),
    }
}

/// What one run of the job printed before it ended or was killed.
struct Segment {
    losses: Vec<(u64, f64)>,
    resumed_at: Option<u64>,
    stderr: String,
    killed: bool,
}

/// Runs the job to `steps` with a checkpoint every step, resuming from the newest complete
/// one; SIGKILLs it `kill` after its first loss line, if given.
fn segment(cache: &Path, place: &Place, steps: u64, kill: Option<Duration>) -> Segment {
    let steps = steps.to_string();
    let mut args: Vec<&str> = SMALL.to_vec();
    args.extend(["--steps", &steps, "--loss-log", "--peak-matmul", "0"]);
    args.extend([
        "--ckpt-every",
        "1",
        "--keep-checkpoints",
        "2",
        "--resume",
        "auto",
    ]);
    // several files per checkpoint, each a little slow: kills land inside saves
    args.extend(["--ckpt-shard-size", "16K"]);
    let mut c = command(cache, &args);
    place.apply(&mut c);
    let err_path = cache.join(format!("stderr-{}", std::process::id()));
    let mut child = c
        .env("NEURON_PC_TEST_CKPT_DELAY_MS", "3")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut seg = Segment {
        losses: Vec::new(),
        resumed_at: None,
        stderr: String::new(),
        killed: false,
    };
    let mut deadline: Option<Instant> = None;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    loop {
        let wait = deadline.map_or(Duration::from_secs(600), |d| {
            d.saturating_duration_since(Instant::now())
        });
        match rx.recv_timeout(wait) {
            Ok(line) => {
                if let Some(rest) = line.strip_prefix("resumed from ") {
                    seg.resumed_at = rest.rsplit(' ').next().and_then(|s| s.parse().ok());
                }
                if line.starts_with("{\"step\"") {
                    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                    seg.losses
                        .push((v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()));
                    if deadline.is_none() {
                        deadline = kill.map(|k| Instant::now() + k);
                    }
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if deadline.is_some() => {
                seg.killed = child.try_wait().ok().flatten().is_none();
                let _ = child.kill();
                let _ = child.wait();
                // the lines already printed are still read
                while let Ok(line) = rx.recv_timeout(Duration::from_secs(5)) {
                    if line.starts_with("{\"step\"") {
                        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                        let loss = v["loss"].as_f64().unwrap();
                        seg.losses.push((v["step"].as_u64().unwrap(), loss));
                    }
                }
                break;
            }
            Err(_) => break,
        }
    }
    let status = child.wait().unwrap();
    seg.stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(
        seg.killed || status.success(),
        "the job failed: {}",
        seg.stderr
    );
    seg
}

/// Kills the job after each of `kills`, resuming each time, then lets it finish; checks every
/// loss any segment printed against the uninterrupted run's.
fn kill_and_resume(cache: &Path, place: &Place, reference: &[(u64, f64)], kills: &[Duration]) {
    let steps = reference.len() as u64;
    let mut kills = kills.iter();
    let mut done = 0;
    let mut landed = 0;
    let mut inside = 0;
    for round in 0.. {
        assert!(round < 4 * reference.len(), "no progress");
        let kill = kills.next().copied();
        let started = std::time::SystemTime::now();
        let seg = segment(cache, place, steps, kill);
        for (step, loss) in &seg.losses {
            let want = reference[*step as usize - 1].1;
            assert_eq!(
                *loss, want,
                "step {step} after {landed} kills: {}",
                seg.stderr
            );
        }
        assert!(
            !seg.stderr.contains("cannot be used"),
            "a resume fell back past a torn checkpoint: {}",
            seg.stderr
        );
        // a step's save starts after its loss is printed and waits for the save before it:
        // a kill loses at most the two newest steps' saves
        let at = seg.resumed_at.unwrap_or(0);
        assert!(
            at <= done,
            "resumed at {at}, but only step {done} was reached"
        );
        assert!(
            at + 2 >= done,
            "resumed at {at}, but step {done} was printed"
        );
        done = seg.losses.last().map_or(done, |l| l.0);
        landed += usize::from(seg.killed);
        if let (true, Place::Local(dir)) = (seg.killed, place) {
            // an unfinished step directory: the kill landed inside a save
            // (written by this segment: a directory an earlier kill left is older)
            let torn = (std::fs::read_dir(dir).into_iter().flatten().flatten()).any(|e| {
                let modified = e.metadata().and_then(|m| m.modified()).ok();
                !e.path().join("manifest.json").exists() && modified >= Some(started)
            });
            inside += usize::from(torn);
        }
        if !seg.killed && done == steps {
            break;
        }
    }
    let at = match place {
        Place::Local(_) => format!(", {inside} of them inside a save"),
        Place::S3 { .. } => String::new(),
    };
    if let Place::Local(dir) = place {
        assert_tidy(dir);
    }
    eprintln!("{landed} kills landed{at}; finished at step {done}");
}

/// After the last run ended normally: nothing the kills left below the newest checkpoint (no
/// step directory without a manifest, no writer's temporary file, no empty directory), no
/// lease (given back at the end), and one run id in every manifest.
fn assert_tidy(dir: &Path) {
    let mut entries: Vec<(u64, PathBuf)> = (std::fs::read_dir(dir).unwrap().flatten())
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            Some((name.strip_prefix("step-")?.parse().ok()?, e.path()))
        })
        .collect();
    entries.sort();
    let newest = entries
        .iter()
        .filter(|(_, p)| p.join("manifest.json").exists())
        .map(|(s, _)| *s)
        .max()
        .expect("a committed checkpoint");
    for (step, path) in entries.iter().filter(|(s, _)| *s <= newest) {
        assert!(
            path.join("manifest.json").exists(),
            "step {step} is unfinished"
        );
        for f in std::fs::read_dir(path).unwrap().flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            assert!(!name.contains(".tmp."), "step {step}: {name} left behind");
        }
    }
    assert!(
        !dir.join(".lease.json").exists(),
        "the lease was not given back"
    );
    // every restart continued the one run: each committed manifest names the same run
    let runs: std::collections::BTreeSet<String> = entries
        .iter()
        .filter_map(|(_, p)| std::fs::read(p.join("manifest.json")).ok())
        .map(|m| {
            let m: serde_json::Value = serde_json::from_slice(&m).unwrap();
            m["run"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(runs.iter().all(|r| r.starts_with("run-")), "{runs:?}");
}

fn reference(cache: &Path, steps: u64) -> Vec<(u64, f64)> {
    let steps = steps.to_string();
    let mut args: Vec<&str> = SMALL.to_vec();
    args.extend(["--steps", &steps, "--loss-log", "--peak-matmul", "0"]);
    run(cache, &args).losses
}

#[test]
fn kills_during_background_saves_never_leave_a_torn_checkpoint() {
    let cache = tmp("kill-local");
    let want = reference(&cache, 12);
    let kills = [0, 9, 25].map(Duration::from_millis);
    let dir = cache.join("ckpt");
    kill_and_resume(&cache, &Place::Local(dir), &want, &kills);
    let m = moto();
    kill_and_resume(&cache, &s3_place(&m, "kill"), &want, &kills);
    std::fs::remove_dir_all(&cache).unwrap();
}

/// `scripts/ckpt-kill-sweep`: kills at random moments, `KILL_SWEEP_SAVES` saves (default 50)
/// on a local directory and as many on S3.
#[test]
#[ignore = "minutes: run by scripts/ckpt-kill-sweep"]
fn kill_sweep() {
    let saves: u64 = std::env::var("KILL_SWEEP_SAVES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let cache = tmp("kill-sweep");
    let want = reference(&cache, saves);
    // xorshift from the clock: different moments each sweep, printed to replay one
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("seed {seed}");
    let mut kills = Vec::new();
    for _ in 0..saves / 2 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        kills.push(Duration::from_millis(seed % 400));
    }
    let m = moto();
    for place in [Place::Local(cache.join("ckpt")), s3_place(&m, "sweep")] {
        kill_and_resume(&cache, &place, &want, &kills);
    }
    std::fs::remove_dir_all(&cache).unwrap();
}
