//! `--shard auto`: the shard taken from a scheduler's array-job variables, the one-line usage
//! error when they are missing, and a real single-node Slurm (Debian's `slurm-wlm` and
//! `munge`, started here on loopback) running `compile-graphs --shard auto` and `compile
//! --shard auto` as 4-task job arrays into one S3 cache (moto), then the job, which compiles
//! nothing.

use crate::support as common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use neuron_pc_test_support::launch::free_port;
use neuron_pc_test_support::s3 as server;

/// Every variable `--shard auto` reads, removed from the commands a test starts unless given.
const SCHEDULER_VARS: &[&str] = &[
    "SLURM_ARRAY_TASK_ID",
    "SLURM_ARRAY_TASK_COUNT",
    "SLURM_ARRAY_TASK_MIN",
    "SLURM_ARRAY_TASK_MAX",
    "SLURM_ARRAY_TASK_STEP",
    "AWS_BATCH_JOB_ARRAY_INDEX",
    "JOB_COMPLETION_INDEX",
];

/// `neuron-pc <args>` with only the scheduler variables in `envs`.
fn npc_in(cache: &Path, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin());
    c.args(args)
        .stdin(Stdio::null())
        .env("NEURON_COMPILE_CACHE_URL", cache)
        .env_remove("NEURON_CC_FLAGS")
        .env_remove("NEURON_PC_EXTRACT_DIR");
    for v in SCHEDULER_VARS {
        c.env_remove(v);
    }
    c.envs(envs.iter().copied()).output().unwrap()
}

/// `n` distinct small programs in `dir`.
fn programs(dir: &Path, n: usize) {
    std::fs::create_dir_all(dir).unwrap();
    for i in 1..=n {
        let t = format!("tensor<{i}x5xf32>");
        std::fs::write(
            dir.join(format!("p{i}.mlir")),
            format!(
                "func.func @main(%a: {t}) -> {t} {{\n  \
                 %0 = stablehlo.add %a, %a : {t}\n  return %0 : {t}\n}}\n"
            ),
        )
        .unwrap();
    }
}

/// The shard a key belongs to, computed here independently: first 8 bytes big-endian mod n.
fn shard_of(key: &str, n: u64) -> u64 {
    u64::from_str_radix(&key[..16], 16).unwrap() % n
}

/// (origin file, key) of every graph a report lists.
fn keys_by_file(v: &serde_json::Value) -> BTreeMap<String, String> {
    v["graphs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["origin"].as_str().unwrap().to_string(),
                g["key"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn shard_auto_without_an_array_job_is_one_usage_error_naming_the_variables() {
    let d = tmp("auto-none");
    programs(&d.join("g"), 2);
    let g = d.join("g");
    type Vars<'a> = &'a [(&'a str, &'a str)];
    // (arguments before the directory, variables, the one line on stderr)
    let cases: &[(&[&str], Vars<'_>, &str)] = &[
        (
            &["compile-graphs", "--shard", "auto"],
            &[],
            "error: --shard auto: none of SLURM_ARRAY_TASK_ID, AWS_BATCH_JOB_ARRAY_INDEX, \
             JOB_COMPLETION_INDEX is set (not an array job?); give --shard I/N",
        ),
        (
            &["compile-graphs", "--shard", "auto"],
            &[("AWS_BATCH_JOB_ARRAY_INDEX", "1")],
            "error: --shard auto: AWS_BATCH_JOB_ARRAY_INDEX gives the index only; give the \
             array size as --shard auto/N",
        ),
        (
            &["compile-graphs", "--shard", "auto/4"],
            &[
                ("SLURM_ARRAY_TASK_ID", "1"),
                ("SLURM_ARRAY_TASK_COUNT", "3"),
            ],
            "error: --shard auto: SLURM_ARRAY_TASK_COUNT=3: the array has 3 tasks, but \
             --shard auto/4 says 4",
        ),
    ];
    for (args, envs, want) in cases {
        let mut a = args.to_vec();
        a.push(g.to_str().unwrap());
        let out = npc_in(&d.join("cache"), &a, envs);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?} {envs:?}: {err}");
        assert_eq!(err.trim_end(), *want, "{args:?} {envs:?}");
        assert!(out.stdout.is_empty());
    }
    // `compile` refuses before the job starts: the probe, which prints a line per step, never
    // ran.
    let probe = probe();
    let out = npc_in(
        &d.join("cache"),
        &["compile", "--shard", "auto", "--", probe.to_str().unwrap()],
        &[("JOB_COMPLETION_INDEX", "0")],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out).trim_end(),
        "error: --shard auto: JOB_COMPLETION_INDEX gives the index only; give the array size \
         as --shard auto/N"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!d.join("cache").join("entries").exists());
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn indexed_job_shards_compile_their_keys_and_together_all_of_them() {
    let d = tmp("auto-k8s");
    let g = d.join("g");
    programs(&g, 6);
    let cache = d.join("cache");
    let mut compiled = Vec::new();
    let mut all = BTreeSet::new();
    for index in ["0", "1"] {
        let out = npc_in(
            &cache,
            &[
                "compile-graphs",
                "--json",
                "--jobs",
                "1",
                "--shard",
                "auto/2",
                g.to_str().unwrap(),
            ],
            &[("JOB_COMPLETION_INDEX", index)],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        let v = json(&out);
        assert_eq!(v["shard"]["index"], index.parse::<u64>().unwrap(), "{v}");
        assert_eq!(v["shard"]["count"], 2, "{v}");
        assert_eq!(v["shard"]["from"], "JOB_COMPLETION_INDEX", "{v}");
        for k in keys(&v, "compiled") {
            assert_eq!(
                shard_of(&k, 2).to_string(),
                index,
                "{k} compiled by shard {index}"
            );
            compiled.push(k);
        }
        all.extend(keys_by_file(&v).into_values());
    }
    assert_eq!(all.len(), 6);
    compiled.sort();
    assert_eq!(compiled, all.into_iter().collect::<Vec<_>>());
    assert_eq!(entry_keys(&cache), compiled);
    std::fs::remove_dir_all(d).unwrap();
}

/// Where a program is: PATH or the sbin directories (not on a plain user's PATH).
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file());
    found
}

/// A daemon running in the foreground, stopped by its pid (SIGTERM, SIGKILL after 10 s).
struct Daemon {
    name: &'static str,
    child: Child,
}

impl Daemon {
    fn start(name: &'static str, cmd: &mut Command, log: &Path) -> Daemon {
        let log = std::fs::File::create(log).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        Daemon { name, child }
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("{} did not stop on SIGTERM; killing it", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// munged, slurmctld and slurmd on loopback, configured in `dir`. Dropping it cancels the
/// job it submitted and stops the daemons, slurmd first.
pub(crate) struct Slurm {
    dir: PathBuf,
    conf: PathBuf,
    job: Option<String>,
    slurmd: Option<Daemon>,
    slurmctld: Option<Daemon>,
    munged: Option<Daemon>,
}

/// Polls `ready` every 200 ms until it holds or `secs` pass.
fn wait_for(secs: u64, what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ready() {
        assert!(Instant::now() < deadline, "{what} within {secs} s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

impl Slurm {
    /// Starts the three daemons; `None` (after printing one line) where the packages are
    /// missing.
    pub(crate) fn start(dir: &Path) -> Option<Slurm> {
        let progs = [
            "munged",
            "slurmctld",
            "slurmd",
            "sbatch",
            "squeue",
            "sinfo",
            "scancel",
            "srun",
        ];
        let found: Vec<Option<PathBuf>> = progs.iter().map(|p| which(p)).collect();
        if let Some(i) = found.iter().position(Option::is_none) {
            println!(
                "skipped: {} not found (Debian packages slurm-wlm and munge; scripts/setup \
                 installs them)",
                progs[i]
            );
            return None;
        }
        let bin = |name: &str| found[progs.iter().position(|p| *p == name).unwrap()].clone();
        std::fs::create_dir_all(dir).unwrap();
        // munged refuses a socket in a directory others cannot enter.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let key = dir.join("munge.key");
        let mut bytes = vec![0u8; 1024];
        std::fs::File::open("/dev/urandom")
            .unwrap()
            .read_exact(&mut bytes)
            .unwrap();
        std::fs::write(&key, bytes).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
        let socket = dir.join("munge.sock");
        let mut s = Slurm {
            dir: dir.to_path_buf(),
            conf: dir.join("slurm.conf"),
            job: None,
            slurmd: None,
            slurmctld: None,
            munged: None,
        };
        let munged = Daemon::start(
            "munged",
            Command::new(bin("munged").unwrap())
                .args(["--foreground", "--force", "--num-threads=2"])
                .arg(format!("--socket={}", socket.display()))
                .arg(format!("--key-file={}", key.display()))
                .arg(format!("--pid-file={}", dir.join("munged.pid").display()))
                .arg(format!("--seed-file={}", dir.join("munged.seed").display()))
                .arg(format!("--log-file={}", dir.join("munged.log").display())),
            &dir.join("munged.out"),
        );
        s.munged = Some(munged);
        wait_for(20, "munged's socket", || socket.exists());

        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        let host = host.trim().split('.').next().unwrap().to_string();
        let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout)
            .unwrap()
            .trim()
            .to_string();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        for sub in ["state", "spool"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let d = dir.display();
        let conf = format!(
            "ClusterName=npctest\n\
             SlurmctldHost={host}(127.0.0.1)\n\
             SlurmctldPort={}\nSlurmdPort={}\n\
             SlurmUser={user}\nSlurmdUser={user}\n\
             AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={}\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\n\
             SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
             SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd.log\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
             SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n\
             JobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/none\n\
             MpiDefault=none\nSwitchType=switch/none\nMailProg=/bin/true\n\
             ReturnToService=2\nSchedulerType=sched/builtin\n\
             NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN\n\
             PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP\n",
            free_port(),
            free_port(),
            socket.display(),
        );
        std::fs::write(&s.conf, conf).unwrap();
        s.slurmctld = Some(Daemon::start(
            "slurmctld",
            Command::new(bin("slurmctld").unwrap())
                .arg("-D")
                .arg("-f")
                .arg(&s.conf),
            &dir.join("slurmctld.out"),
        ));
        s.slurmd = Some(Daemon::start(
            "slurmd",
            Command::new(bin("slurmd").unwrap())
                .arg("-D")
                .arg("-f")
                .arg(&s.conf),
            &dir.join("slurmd.out"),
        ));
        let mut state = String::new();
        wait_for(60, "the node idle in sinfo", || {
            for d in [&mut s.munged, &mut s.slurmctld, &mut s.slurmd]
                .into_iter()
                .flatten()
            {
                assert!(d.running(), "{} exited; see {}", d.name, s.dir.display());
            }
            let o = s.client("sinfo").args(["-h", "-o", "%T"]).output().unwrap();
            state = String::from_utf8_lossy(&o.stdout).trim().to_string();
            state == "idle"
        });
        Some(s)
    }

    /// A Slurm client command that talks to this cluster.
    pub(crate) fn client(&self, name: &str) -> Command {
        let mut c = Command::new(which(name).unwrap());
        c.env("SLURM_CONF", &self.conf).stdin(Stdio::null());
        c
    }

    /// Runs `script` as tasks 0-3 of a job array with `envs` (each task with a local tier of
    /// its own, as on separate nodes), waits for it, and returns each task's JSON report.
    fn array(&mut self, out: &Path, script: &str, envs: &[(&str, &str)]) -> Vec<serde_json::Value> {
        std::fs::create_dir_all(out).unwrap();
        let mut sbatch = self.client("sbatch");
        sbatch
            .args([
                "--parsable",
                "--array=0-3",
                "--ntasks=1",
                "--cpus-per-task=1",
            ])
            .arg(format!("--output={}/task-%a.json", out.display()))
            .arg(format!("--error={}/task-%a.err", out.display()))
            .arg(format!("--chdir={}", out.display()))
            .arg("--wrap")
            .arg(format!(
                "NEURON_PC_CACHE_LOCAL_DIR={}/local-$SLURM_ARRAY_TASK_ID {script}",
                out.display()
            ))
            .env_remove("NEURON_CC_FLAGS")
            .env_remove("NEURON_COMPILE_CACHE_URL")
            .env_remove("NEURON_PC_EXTRACT_DIR")
            .envs(envs.iter().copied());
        for v in SCHEDULER_VARS {
            sbatch.env_remove(v);
        }
        let sub = sbatch.output().unwrap();
        assert!(sub.status.success(), "sbatch: {}", stderr(&sub));
        let job = String::from_utf8_lossy(&sub.stdout).trim().to_string();
        self.job = Some(job.clone());
        wait_for(300, "the job array to finish", || {
            self.queued(&job).is_empty()
        });
        self.job = None;
        (0..4)
            .map(|task| {
                let text = std::fs::read_to_string(out.join(format!("task-{task}.json"))).unwrap();
                let err = std::fs::read_to_string(out.join(format!("task-{task}.err"))).unwrap();
                serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("task {task}: {e}: {text}\nstderr: {err}"))
            })
            .collect()
    }

    /// Jobs of `job` still pending or running.
    fn queued(&self, job: &str) -> String {
        let o = self
            .client("squeue")
            .args(["-h", "-j", job])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        if let Some(job) = self.job.take() {
            if !self.queued(&job).is_empty() {
                let _ = self.client("scancel").arg(&job).status();
                let deadline = Instant::now() + Duration::from_secs(20);
                while Instant::now() < deadline && !self.queued(&job).is_empty() {
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
        drop(self.slurmd.take());
        drop(self.slurmctld.take());
        drop(self.munged.take());
    }
}

#[test]
fn a_slurm_job_array_compiles_every_graph_once_into_one_s3_cache() {
    let d = tmp("slurm");
    let Some(mut slurm) = Slurm::start(&d.join("slurm")) else {
        return;
    };
    let m = server::moto();
    let bucket = server::new_bucket(&m, "slurm");
    let url = format!("s3://{bucket}/cache");
    let endpoint = m.endpoint();
    let s3_env = [
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_REGION", "us-east-1"),
    ];

    // 24 programs, of which two per shard are kept: every task has work of its own.
    let all = d.join("all");
    programs(&all, 24);
    let dry = npc_in(
        &d.join("unused"),
        &[
            "compile-graphs",
            "--dry-run",
            "--json",
            all.to_str().unwrap(),
        ],
        &[],
    );
    assert!(dry.status.success(), "{}", stderr(&dry));
    let graphs = d.join("graphs");
    std::fs::create_dir_all(&graphs).unwrap();
    let mut per_shard: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for (file, key) in keys_by_file(&json(&dry)) {
        let mine = per_shard.entry(shard_of(&key, 4)).or_default();
        if mine.len() < 2 {
            let name = Path::new(&file).file_name().unwrap().to_owned();
            std::fs::copy(&file, graphs.join(name)).unwrap();
            mine.push(key);
        }
    }
    assert_eq!(
        per_shard.len(),
        4,
        "24 programs cover the 4 shards: {per_shard:?}"
    );
    let want: BTreeSet<String> = per_shard.values().flatten().cloned().collect();

    // Each task: its own local tier (a node's disk), the shared bucket, its index from Slurm.
    let script = format!(
        "{} compile-graphs --shard auto --json --jobs 1 --cache {url} {}",
        bin(),
        graphs.display()
    );
    let reports = slurm.array(&d.join("graphs-out"), &script, &s3_env);
    let compiled_by = compiled_once_per_shard(&reports, 8);
    assert_eq!(compiled_by, want);

    // A later run on another machine (no local tier: every hit comes from the bucket)
    // compiles nothing.
    let later = npc_in(
        &d.join("unused"),
        &[
            "compile-graphs",
            "--json",
            "--cache",
            &url,
            graphs.to_str().unwrap(),
        ],
        &[&s3_env[..], &[("NEURON_PC_CACHE_LOCAL_TIER", "0")]].concat(),
    );
    assert!(later.status.success(), "{}", stderr(&later));
    let v = json(&later);
    assert_eq!(
        (
            v["found"].as_u64(),
            v["cached"].as_u64(),
            v["compiled"].as_u64()
        ),
        (Some(8), Some(8), Some(0)),
        "{v}"
    );

    // `compile --shard auto` of a job: every task runs the trial run and compiles its share;
    // then the job itself, on a machine with no local tier, compiles nothing.
    let job_url = format!("s3://{bucket}/job");
    let script = format!(
        "{} compile --shard auto --json --jobs 1 --cache {job_url} -- {} --steps 2",
        bin(),
        probe().display()
    );
    let reports = slurm.array(&d.join("job-out"), &script, &s3_env);
    let found = reports[0]["found"].as_u64().unwrap();
    assert!(found >= 3, "{}", reports[0]);
    let compiled = compiled_once_per_shard(&reports, found);
    assert_eq!(compiled.len() as u64, found);
    let envs = [&s3_env[..], &[("NEURON_PC_CACHE_LOCAL_TIER", "0")]].concat();
    let (_, metrics) = run_probe_with(Path::new(&job_url), &["--steps", "2"], &envs);
    assert_eq!(metrics["compiles"], 0, "{metrics}");
    assert_eq!(metrics["remote_hits"].as_u64(), Some(found), "{metrics}");
    drop(slurm);
    std::fs::remove_dir_all(d).unwrap();
}

/// Checks the reports of a 4-task array over `found` graphs: task `i` is shard `i` of 4 (from
/// Slurm's variables), compiled only keys of its shard, and every key was compiled by exactly
/// one task. Returns the keys compiled.
fn compiled_once_per_shard(reports: &[serde_json::Value], found: u64) -> BTreeSet<String> {
    let mut compiled_by: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (task, v) in reports.iter().enumerate() {
        assert_eq!(v["shard"]["count"], 4, "task {task}: {v}");
        assert_eq!(
            v["shard"]["from"], "SLURM_ARRAY_TASK_ID",
            "task {task}: {v}"
        );
        let index = v["shard"]["index"].as_u64().unwrap();
        assert_eq!(index, task as u64, "array task {task} is shard {task}");
        assert_eq!(
            (
                v["found"].as_u64(),
                v["failed"].as_u64(),
                v["cached"].as_u64()
            ),
            (Some(found), Some(0), Some(0)),
            "{v}"
        );
        let compiled = v["compiled"].as_u64().unwrap();
        assert_eq!(compiled + v["other_shard"].as_u64().unwrap(), found, "{v}");
        for k in keys(v, "compiled") {
            assert_eq!(shard_of(&k, 4), index, "{k} was compiled by shard {index}");
            compiled_by.entry(k).or_default().push(index);
        }
    }
    for (k, by) in &compiled_by {
        assert_eq!(by.len(), 1, "{k} compiled by shards {by:?}");
    }
    compiled_by.into_keys().collect()
}
