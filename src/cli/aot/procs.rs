//! Worker processes as the scheduler sees them: spawn, hand a job, collect results from a
//! reader thread, notice deaths, stop.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;
use std::time::Instant;

use super::jobs::GraphJob;
use super::worker::{WorkerJob, WorkerResult, RESULT_PREFIX};
use super::WORKER_SUBCOMMAND;

/// A result line from worker `id`.
pub struct Message {
    pub worker: usize,
    pub result: WorkerResult,
}

/// The graph a worker is compiling.
pub struct Busy {
    pub job: GraphJob,
    /// The worker compiling it.
    pub worker: usize,
    pub attempt: u32,
    pub started: Instant,
    /// Length of the worker's stderr file when the job was handed over.
    stderr_from: u64,
}

/// One worker process.
pub struct Worker {
    pub id: usize,
    child: Child,
    stdin: Option<ChildStdin>,
    reader: Option<JoinHandle<()>>,
    stderr: PathBuf,
    pub busy: Option<Busy>,
}

/// How to start workers.
pub struct Spawner {
    pub exe: PathBuf,
    pub flags_text: String,
    pub cache_url: Option<String>,
    pub work_dir: PathBuf,
    pub tx: Sender<Message>,
    next_id: usize,
}

impl Spawner {
    pub fn new(
        exe: PathBuf,
        flags_text: String,
        cache_url: Option<String>,
        work_dir: PathBuf,
        tx: Sender<Message>,
    ) -> Spawner {
        Spawner {
            exe,
            flags_text,
            cache_url,
            work_dir,
            tx,
            next_id: 0,
        }
    }

    /// Worker processes started so far.
    pub fn started(&self) -> usize {
        self.next_id
    }

    /// Starts a worker; it loads the plugin while the caller goes on.
    pub fn spawn(&mut self) -> anyhow::Result<Worker> {
        let id = self.next_id;
        self.next_id += 1;
        let stderr = self.work_dir.join(format!("worker-{id}.stderr"));
        let mut cmd = Command::new(&self.exe);
        cmd.arg(WORKER_SUBCOMMAND)
            .env("NEURON_CC_FLAGS", &self.flags_text)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr)?);
        if !neuron_pc_compiler::pjrt::JEMALLOC {
            // a worker only compiles: glibc's one arena would slow XLA's compiler threads
            // (`compiler/src/pjrt/malloc.rs`) and its buffer reuse would save nothing
            cmd.env(neuron_pc_compiler::pjrt::MALLOC_TUNING_VAR, "0");
        }
        if let Some(u) = &self.cache_url {
            cmd.arg("--cache").arg(u);
        }
        let mut child = cmd.spawn()?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("worker has no stdout pipe"))?;
        let tx = self.tx.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Some(json) = line.strip_prefix(RESULT_PREFIX) else {
                    continue;
                };
                if let Ok(result) = serde_json::from_str::<WorkerResult>(json) {
                    if tx.send(Message { worker: id, result }).is_err() {
                        break;
                    }
                }
            }
        });
        Ok(Worker {
            id,
            child,
            stdin,
            reader: Some(reader),
            stderr,
            busy: None,
        })
    }
}

impl Worker {
    /// Hands `job` over; false when the worker cannot take it (its stdin is gone).
    pub fn start(&mut self, job: GraphJob, attempt: u32) -> bool {
        let line = serde_json::to_string(&WorkerJob {
            key: job.key.clone(),
            mlir: job.mlir.clone(),
            replicas: job.replicas.clone(),
            partitioned: job.partitioned,
        });
        let sent = match (&mut self.stdin, line) {
            (Some(s), Ok(l)) => writeln!(s, "{l}").and_then(|_| s.flush()).is_ok(),
            _ => false,
        };
        let stderr_from = std::fs::metadata(&self.stderr).map_or(0, |m| m.len());
        self.busy = Some(Busy {
            job,
            worker: self.id,
            attempt,
            started: Instant::now(),
            stderr_from,
        });
        sent
    }

    /// The exit status, if the process ended.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits for the reader thread, so every result the process wrote has been sent.
    pub fn drain_reader(&mut self) {
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }

    /// What the worker wrote to stderr since its current job started: the last non-empty line.
    pub fn stderr_tail(&self) -> String {
        let text = std::fs::read(&self.stderr).unwrap_or_default();
        let from = self
            .busy
            .as_ref()
            .map_or(0, |b| (b.stderr_from as usize).min(text.len()));
        last_line(&String::from_utf8_lossy(&text[from..]))
    }

    /// Kills the process and reaps it.
    pub fn kill(&mut self) {
        // An error means it already exited; waiting then reaps it.
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.drain_reader();
    }

    /// Closes stdin (the worker exits after its current job) and waits for it.
    pub fn finish(mut self) {
        self.stdin = None;
        let _ = self.child.wait();
        self.drain_reader();
    }
}

/// The last non-empty line of `s`.
pub fn last_line(s: &str) -> String {
    s.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .to_string()
}
