//! `train_llama`'s checkpoints under the faults a chaos run found (issue 56): what killed saves
//! leave behind goes at the next commit and at resume, a save that ran out of disk leaves its
//! room to the next (a real full tmpfs), an old checkpoint that cannot be deleted (a real
//! immutable file) is said once and keep-K still holds for the rest, a flipped bit in a
//! manifest or an index makes that checkpoint unusable, the resume falling back past it, and a
//! second job on a location another job writes stops before step 1, and a run neither resumes
//! another run's checkpoints nor saves among them unless told to.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::llama_job::{command, tmp, SMALL};

/// `train_llama SMALL.. args..` (no launcher's variables); its output, succeeded or not.
fn train(cache: &Path, args: &[&str]) -> Output {
    train_as(cache, None, args)
}

/// [`train`] as run `id` (`NEURON_PC_RUN_ID`; `None`: unset).
fn train_as(cache: &Path, id: Option<&str>, args: &[&str]) -> Output {
    let all = [SMALL, &["--peak-matmul", "0"], args].concat();
    let mut c = command(cache, &all);
    for v in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "RUST_BACKTRACE",
    ] {
        c.env_remove(v);
    }
    match id {
        Some(id) => c.env("NEURON_PC_RUN_ID", id),
        None => c.env_remove("NEURON_PC_RUN_ID"),
    };
    c.output().unwrap()
}

/// [`train`], which must succeed: its stdout and stderr.
fn ok(cache: &Path, args: &[&str]) -> (String, String) {
    let out = train(cache, args);
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{args:?}: {stdout}\n{stderr}");
    (stdout, stderr)
}

fn texts(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn step_dir(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("step-{step:08}"))
}

/// The steps with a commit point in `dir`, in order.
fn committed(dir: &Path) -> Vec<u64> {
    let mut out: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("manifest.json").is_file())
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("step-")?.parse().ok())
        .collect();
    out.sort_unstable();
    out
}

fn arg(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn what_killed_saves_leave_goes_at_resume_and_at_the_next_commit() {
    let d = tmp("ckpt-leftovers");
    let (cache, dir) = (d.join("cache"), d.join("ckpt"));
    let ckpt = ["--ckpt-dir", &arg(&dir), "--ckpt-every", "2"];
    ok(&cache, &[&ckpt[..], &["--steps", "4"]].concat());
    assert_eq!(committed(&dir), [2, 4]);
    // as kills leave them: an unfinished save below the newest, an empty step directory, a
    // writer's temporary file beside a committed checkpoint; and a save above the newest,
    // which a writer may still be finishing
    let plant = |step: u64, file: &str| {
        std::fs::create_dir_all(step_dir(&dir, step)).unwrap();
        std::fs::write(step_dir(&dir, step).join(file), b"half").unwrap();
    };
    plant(3, "model-00001-of-00001.safetensors");
    plant(3, ".model-00001-of-00001.safetensors.tmp.4242");
    std::fs::create_dir_all(step_dir(&dir, 1)).unwrap();
    plant(2, ".manifest.json.tmp.4242");
    plant(9, ".model-00001-of-00001.safetensors.tmp.4242");
    // resumed: gone before step 5, but what lies above the newest
    let (stdout, _) = ok(
        &cache,
        &[&ckpt[..], &["--steps", "6", "--resume", "auto"]].concat(),
    );
    assert!(stdout.contains("resumed from"), "{stdout}");
    assert!(!step_dir(&dir, 3).exists() && !step_dir(&dir, 1).exists());
    assert!(!step_dir(&dir, 2).join(".manifest.json.tmp.4242").exists());
    assert!(step_dir(&dir, 9)
        .join(".model-00001-of-00001.safetensors.tmp.4242")
        .exists());
    assert_eq!(committed(&dir), [2, 4, 6]);
    // and at the next commit of a run resumed from an older checkpoint (step 4 saved again)
    plant(5, "model-00001-of-00001.safetensors");
    plant(4, ".model-00001-of-00001.safetensors.tmp.77");
    ok(
        &cache,
        &[&ckpt[..], &["--steps", "4", "--resume", "step-00000002"]].concat(),
    );
    assert!(!step_dir(&dir, 5).exists());
    assert!(!step_dir(&dir, 4)
        .join(".model-00001-of-00001.safetensors.tmp.77")
        .exists());
    assert_eq!(committed(&dir), [2, 4, 6]);
    let _ = std::fs::remove_dir_all(d);
}

/// Pages of 4 KiB that `bytes` take on a tmpfs.
fn pages(bytes: u64) -> u64 {
    bytes.div_ceil(4096)
}

#[test]
fn a_save_that_ran_out_of_disk_leaves_its_room_to_the_next() {
    let d = tmp("ckpt-full");
    let cache = d.join("cache");
    // one checkpoint's pages: its data files and index, and its manifest
    let probe = d.join("probe");
    ok(&cache, &["--ckpt-dir", &arg(&probe), "--steps", "1"]);
    let (mut data, mut manifest) = (0, 0);
    for f in std::fs::read_dir(step_dir(&probe, 1)).unwrap().flatten() {
        let p = pages(f.metadata().unwrap().len());
        match f.file_name() == "manifest.json" {
            true => manifest += p,
            false => data += p,
        }
    }
    let whole = data + manifest;
    // a real full disk: a tmpfs of 2.5 checkpoints
    let mount = d.join("disk");
    std::fs::create_dir_all(&mount).unwrap();
    let size = format!("size={}", (whole * 5 / 2) * 4096);
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &size, "tmpfs"])
        .arg(&mount)
        .status();
    if !mounted.is_ok_and(|s| s.success()) {
        eprintln!("skipped: mounting a tmpfs is not permitted here (root is needed)");
        return;
    }
    let dir = mount.join("ckpt");
    let ckpt = ["--ckpt-dir", &arg(&dir), "--ckpt-every", "1"];
    let result = std::panic::catch_unwind(|| {
        ok(&cache, &[&ckpt[..], &["--steps", "1"]].concat());
        // fill the disk, then free exactly a save's data and index and the job's lease: its
        // manifest cannot fit
        let filler = mount.join("filler");
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&filler).unwrap();
            let block = vec![0u8; 1 << 16];
            while f.write_all(&block).is_ok() {}
            let len = f.metadata().unwrap().len();
            f.set_len((pages(len) - data - 1) * 4096).unwrap();
        }
        let out = train(
            &cache,
            &[&ckpt[..], &["--steps", "2", "--resume", "auto"]].concat(),
        );
        let (stdout, stderr) = texts(&out);
        assert!(!out.status.success(), "{stdout}\n{stderr}");
        assert!(stderr.contains("was not saved"), "{stderr}");
        // the failed save took its files with it
        assert!(!step_dir(&dir, 2).exists(), "{stderr}");
        std::fs::remove_file(&filler).unwrap();
        // room for the next (step 3 alone): without the cleanup, step 2's files would hold 1
        // of the 1.5 checkpoints left and this save would fail too
        let last = ["--ckpt-dir", &arg(&dir), "--steps", "3", "--resume", "auto"];
        let (stdout, _) = ok(&cache, &last);
        assert!(stdout.contains("step-00000001"), "{stdout}");
        assert_eq!(committed(&dir), [1, 3]);
    });
    let _ = Command::new("umount").arg(&mount).status();
    let _ = std::fs::remove_dir_all(&d);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn an_old_checkpoint_that_cannot_be_deleted_is_said_once_and_keep_k_holds_for_the_rest() {
    let d = tmp("ckpt-immutable");
    let (cache, dir) = (d.join("cache"), d.join("ckpt"));
    let ckpt = [
        "--ckpt-dir",
        &arg(&dir),
        "--ckpt-every",
        "1",
        "--keep-checkpoints",
        "2",
    ];
    ok(&cache, &[&ckpt[..], &["--steps", "2"]].concat());
    assert_eq!(committed(&dir), [1, 2]);
    // a real undeletable file (immutable: not even root deletes it)
    let stuck = step_dir(&dir, 1).join("model-00001-of-00001.safetensors");
    let immutable = Command::new("chattr").arg("+i").arg(&stuck).status();
    if !immutable.is_ok_and(|s| s.success()) {
        eprintln!("skipped: chattr +i is not permitted here (root on ext4/tmpfs is needed)");
        return;
    }
    let result = std::panic::catch_unwind(|| {
        let (_, stderr) = ok(
            &cache,
            &[&ckpt[..], &["--steps", "6", "--resume", "auto"]].concat(),
        );
        // four saves tried to delete it; one line says so
        let said = stderr.matches("cannot delete step-00000001").count();
        assert_eq!(said, 1, "{stderr}");
        // the newest 2 complete ones, and step 1 no longer complete (its commit point went
        // first); steps 2 to 4 were deleted past it
        assert_eq!(committed(&dir), [5, 6]);
        for step in 2..=4 {
            assert!(!step_dir(&dir, step).exists(), "step {step}");
        }
    });
    let _ = Command::new("chattr").arg("-i").arg(&stuck).status();
    let _ = std::fs::remove_dir_all(&d);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn a_flipped_bit_in_a_manifest_or_an_index_makes_the_resume_fall_back() {
    let d = tmp("ckpt-flip");
    let cache = d.join("cache");
    let first = d.join("ckpt");
    ok(
        &cache,
        &[
            "--ckpt-dir",
            &arg(&first),
            "--ckpt-every",
            "1",
            "--steps",
            "2",
        ],
    );
    for file in ["manifest.json", "model.safetensors.index.json"] {
        let dir = d.join(format!("flip-{file}"));
        crate::processes::copy_dir(&first, &dir);
        // one bit in the middle of step 2's file (a key, a value or a digest)
        let path = step_dir(&dir, 2).join(file);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x04;
        std::fs::write(&path, &bytes).unwrap();
        let args = ["--ckpt-dir", &arg(&dir), "--steps", "3", "--resume", "auto"];
        let (stdout, stderr) = ok(&cache, &args);
        assert!(
            stdout.contains("resumed from") && stdout.contains("step-00000001"),
            "{stdout}"
        );
        assert!(stderr.contains("cannot be used"), "{file}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn a_second_job_on_a_location_stops_before_step_1_and_a_gone_one_is_taken_over() {
    let d = tmp("ckpt-lease");
    let (cache, dir) = (d.join("cache"), d.join("ckpt"));
    let lease = dir.join(".lease.json");
    // job A: a long run, saving
    let at = arg(&dir);
    let all = [SMALL, &["--peak-matmul", "0", "--steps", "100000"]].concat();
    let all = [&all[..], &["--ckpt-dir", &at, "--ckpt-every", "50"]].concat();
    let mut a = command(&cache, &all)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while !lease.exists() && started.elapsed() < std::time::Duration::from_secs(120) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let result = std::panic::catch_unwind(|| {
        assert!(lease.exists(), "job A took no lease");
        // job B, on the same directory while A runs: one line naming A, no step taken
        let out = train(&cache, &["--ckpt-dir", &arg(&dir), "--steps", "2"]);
        let (stdout, stderr) = texts(&out);
        assert!(!out.status.success(), "{stdout}");
        let named = format!("another job writes checkpoints here (pid {}", a.id());
        assert!(stderr.contains(&named), "{stderr}");
        assert!(!stdout.contains("step     1"), "{stdout}");
    });
    // A is killed: its lease stays, and the next job takes it over, saying so
    a.kill().unwrap();
    a.wait().unwrap();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    assert!(lease.exists());
    let (_, stderr) = ok(
        &cache,
        &["--ckpt-dir", &arg(&dir), "--steps", "2", "--resume"],
    );
    assert!(
        stderr.contains("taking them over from a job that is gone"),
        "{stderr}"
    );
    // given back when the job ends
    assert!(!lease.exists());
    let _ = std::fs::remove_dir_all(d);
}

/// The run id in the manifest of `dir`'s checkpoint of `step`.
fn run_of(dir: &Path, step: u64) -> String {
    let m = std::fs::read(step_dir(dir, step).join("manifest.json")).unwrap();
    let m: serde_json::Value = serde_json::from_slice(&m).unwrap();
    m["run"].as_str().unwrap().to_string()
}

#[test]
fn a_run_neither_continues_nor_writes_among_another_runs_checkpoints_unless_told() {
    let d = tmp("ckpt-run-id");
    let (cache, dir) = (d.join("cache"), d.join("ckpt"));
    let ckpt = ["--ckpt-dir", &arg(&dir), "--ckpt-every", "2"];
    let run = |id, extra: &[&str]| {
        let out = train_as(&cache, id, &[&ckpt[..], extra].concat());
        let (stdout, stderr) = texts(&out);
        (out.status.success(), stdout, stderr)
    };
    let (done, stdout, stderr) = run(Some("llama-a"), &["--steps", "2"]);
    assert!(done, "{stdout}{stderr}");
    assert_eq!(run_of(&dir, 2), "llama-a");
    // a run from scratch on that directory: refused before step 1, whatever its name
    for id in [None, Some("llama-a"), Some("llama-b")] {
        let (done, stdout, stderr) = run(id, &["--steps", "4"]);
        assert!(!done, "{stdout}");
        assert!(
            stderr.contains("would save among 1 complete checkpoint(s) already here")
                && stderr.contains("(the newest step-00000002 of run llama-a)"),
            "{stderr}"
        );
        assert!(!stdout.contains("step     1"), "{stdout}");
    }
    // another named run does not resume it without --adopt-run
    let (done, stdout, stderr) = run(Some("llama-b"), &["--steps", "4", "--resume"]);
    assert!(!done, "{stdout}");
    assert!(
        stderr.contains("belongs to run llama-a, and this run is llama-b")
            && stderr.contains("--adopt-run"),
        "{stderr}"
    );
    assert!(!stdout.contains("step     3"), "{stdout}");
    assert_eq!(committed(&dir), [2]);
    // told to: it continues the state under its own name
    let (done, stdout, stderr) = run(
        Some("llama-b"),
        &["--steps", "4", "--resume", "--adopt-run"],
    );
    assert!(done, "{stdout}{stderr}");
    assert!(stdout.contains("continuing run llama-b"), "{stdout}");
    assert!(stderr.contains("of run llama-a, as asked"), "{stderr}");
    assert_eq!(run_of(&dir, 4), "llama-b");
    // a restart without a name continues the run it resumes
    let (done, stdout, stderr) = run(None, &["--steps", "6", "--resume"]);
    assert!(done, "{stdout}{stderr}");
    assert!(stdout.contains("continuing run llama-b"), "{stdout}");
    assert_eq!(run_of(&dir, 6), "llama-b");
    // and its own name resumes it silently
    let (done, stdout, stderr) = run(Some("llama-b"), &["--steps", "8", "--resume"]);
    assert!(done && !stderr.contains("as asked"), "{stdout}{stderr}");
    assert_eq!(committed(&dir), [2, 4, 6, 8]);
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn a_lease_another_host_renews_stops_a_job_and_one_it_stopped_renewing_is_taken_over() {
    let d = tmp("ckpt-lease-host");
    let (cache, dir) = (d.join("cache"), d.join("ckpt"));
    std::fs::create_dir_all(&dir).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // a job of another host, as its lease says: renewed `silent` seconds ago
    let plant = |silent: u64| {
        let lease = serde_json::json!({
            "host": "node-17", "pid": 4242, "since": now - 3600, "renewed": now - silent
        });
        std::fs::write(dir.join(".lease.json"), lease.to_string()).unwrap();
    };
    plant(10);
    let out = train(&cache, &["--ckpt-dir", &arg(&dir), "--steps", "2"]);
    let (stdout, stderr) = texts(&out);
    assert!(!out.status.success(), "{stdout}");
    // renewed 10 s ago when planted, a little more by the time the job looks
    let ago: u64 = stderr
        .split("renewed ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        stderr.contains("another job writes checkpoints here (pid 4242 on node-17")
            && (10..60).contains(&ago),
        "{stderr}"
    );
    assert!(!stdout.contains("step     1"), "{stdout}");
    // silent for 3 minutes: gone, taken over with a warning; given back at the end
    plant(180);
    let (_, stderr) = ok(&cache, &["--ckpt-dir", &arg(&dir), "--steps", "2"]);
    assert!(
        stderr.contains("taking them over from a job that is gone (pid 4242 on node-17"),
        "{stderr}"
    );
    assert!(!dir.join(".lease.json").exists());
    let _ = std::fs::remove_dir_all(d);
}
