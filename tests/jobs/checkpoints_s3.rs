//! Checkpoints on S3 (a loopback moto_server behind the fault-injecting proxy): saved in the
//! background as multipart uploads, the newest K kept, resumed by reading straight from the
//! bucket; 500s, dropped connections and a slow server cost a warning and a retry, a server
//! that stays down costs the save, never the training, and one that stops answering costs the
//! loop at most 2 s a save (the save skipped, one warning).

use neuron_pc_test_support::process::run_alone;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use neuron_pc::compile::CacheConfig;
use neuron_pc::models::{SyntheticTask, TextEncoder, TextEncoderConfig};
use neuron_pc::nn::Module;
use neuron_pc::optim::AdamW;
use neuron_pc::state::{CheckpointOptions, Checkpoints};
use neuron_pc::state_dict::{PartOptions, S3Options, StateDict};
use neuron_pc::{grad, state, DType, DeviceConfig, LazyDevice, Tensor};
use neuron_pc_test_support::proxy::{Fault, Proxy};
use neuron_pc_test_support::s3::{moto, new_bucket, Moto};

/// An embedding of 30000 x 32: 3.7 MiB of parameters, 11 MiB of state: one file of three
/// 5 MiB parts.
fn config() -> TextEncoderConfig {
    TextEncoderConfig {
        vocab: 30_000,
        embed: 32,
        seq_len: 8,
        mlp: vec![16],
        classes: 4,
    }
}

struct Job {
    dev: LazyDevice,
    model: TextEncoder,
    params: Vec<Tensor>,
    opt: AdamW,
}

impl Job {
    fn new() -> Job {
        let dev = LazyDevice::new(DeviceConfig {
            cache: CacheConfig::disabled(),
            ..DeviceConfig::default()
        })
        .expect("cpu device: run scripts/setup");
        let model = TextEncoder::new(&dev, config(), 3).unwrap();
        let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
        let opt = AdamW::new(&dev, &params, 0.01).unwrap();
        Job {
            dev,
            model,
            params,
            opt,
        }
    }

    fn step(&mut self, i: u64) -> f64 {
        let task = SyntheticTask::new(config(), 5);
        let b: Vec<Tensor> = (task.batch(0, i, 8).iter())
            .map(|h| self.dev.tensor(h).unwrap())
            .collect();
        let loss = self.model.loss(&b[0], &b[1], &b[2]).unwrap();
        let g = grad(&loss, &self.params.iter().collect::<Vec<_>>()).unwrap();
        let lr = self.dev.scalar(1e-2, DType::F32).unwrap();
        self.opt.step(&self.params, &g, &lr).unwrap();
        self.dev.mark_step().unwrap();
        loss.item().unwrap()
    }

    fn state(&self, step: u64) -> StateDict {
        state::training_state(&self.model, &self.opt, step).unwrap()
    }
}

/// A bucket on the shared server, reached through a proxy of its own.
struct Bucket {
    _moto: Arc<Moto>,
    proxy: Proxy,
    url: String,
}

fn bucket(tag: &str) -> Bucket {
    let m = moto();
    let name = new_bucket(&m, tag);
    Bucket {
        proxy: Proxy::start(m.port),
        url: format!("s3://{name}/runs/7"),
        _moto: m,
    }
}

fn open(b: &Bucket, keep: Option<usize>) -> Checkpoints {
    // every save waits for the one before, however slow (as a local directory's do)
    open_waiting(b, keep, Duration::from_secs(600))
}

/// [`open`], a save waiting `busy_wait` for the one before before it is skipped.
fn open_waiting(b: &Bucket, keep: Option<usize>, busy_wait: Duration) -> Checkpoints {
    let options = CheckpointOptions {
        keep,
        busy_wait,
        parts: PartOptions {
            part_size: 5 << 20,
            concurrency: 2,
            attempts: 5,
            backoff: Duration::from_millis(50),
        },
        s3: Some(S3Options {
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
            retry_timeout: Duration::ZERO,
            endpoint: Some(b.proxy.endpoint()),
            credentials: Some(("testing".into(), "testing".into())),
            ..S3Options::default()
        }),
        ..Default::default()
    };
    Checkpoints::open(&b.url, options).unwrap()
}

/// Everything the process logs (warnings of writer threads included), for the tests that
/// look for their retries' lines.
fn log() -> &'static Mutex<Vec<u8>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || Sink(sink.clone()))
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        buf
    })
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logged(needle: &str) -> usize {
    let text = String::from_utf8_lossy(&log().lock().unwrap()).into_owned();
    text.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn saves_keep_the_newest_two_and_resume_from_the_bucket() {
    let b = bucket("keep");
    let mut job = Job::new();
    let mut ckpts = open(&b, Some(2));
    assert_eq!(ckpts.resume(&job.model, &job.opt).unwrap(), None);
    let mut states = Vec::new();
    for i in 0..3 {
        job.step(i);
        ckpts.save(&job.model, &job.opt, i + 1).unwrap();
        states.push(job.state(i + 1));
    }
    ckpts.wait().unwrap();
    let steps: Vec<u64> = ckpts.list().unwrap().iter().map(|c| c.step).collect();
    assert_eq!(steps, [2, 3]);
    // the uploads were multipart: three parts and a completion per file at least
    assert!(b.proxy.writes() >= 3 * 5, "{} writes", b.proxy.writes());

    let fresh = Job::new();
    let r = open(&b, Some(2))
        .resume(&fresh.model, &fresh.opt)
        .unwrap()
        .unwrap();
    assert_eq!(r.checkpoint.step, 3);
    assert!(
        r.location.ends_with("runs/7/step-00000003"),
        "{}",
        r.location
    );
    assert_eq!(fresh.state(3), states[2]);
}

#[test]
fn errors_resets_and_a_slow_server_during_a_save_cost_a_retry() {
    // alone in a process of its own: it reads the process's log, where other tests would write
    if !run_alone(
        module_path!(),
        "errors_resets_and_a_slow_server_during_a_save_cost_a_retry",
    ) {
        return;
    }
    log();
    let b = bucket("faults");
    let mut job = Job::new();
    job.step(0);
    let mut ckpts = open(&b, None);
    // a part answered 500 twice, another dropped mid-request, one held past the 2 s bound
    b.proxy.only("PUT", "partNumber=2");
    b.proxy.push(Fault::Status(500), 2);
    b.proxy.push(Fault::Reset, 1);
    b.proxy.push(Fault::Delay(Duration::from_secs(3)), 1);
    let want = job.state(1);
    ckpts.save(&job.model, &job.opt, 1).unwrap();
    job.step(1); // training goes on meanwhile
    let info = ckpts.wait().unwrap().unwrap();
    assert_eq!(b.proxy.pending(), 0, "every fault was met");
    assert!(
        logged(&format!("part 2 of {}", info.name)) >= 4,
        "one warning per retry"
    );

    // reads cut mid-body while resuming are retried too
    b.proxy.only("GET", "model-00001");
    b.proxy.push(Fault::CutBody, 1);
    b.proxy.push(Fault::Status(503), 1);
    let got = ckpts.load(&info).unwrap();
    assert_eq!(b.proxy.pending(), 0);
    assert_eq!(got, want);
}

#[test]
fn a_server_that_stays_down_costs_the_save_not_the_training() {
    // alone in a process of its own: it reads the process's log, where other tests would write
    if !run_alone(
        module_path!(),
        "a_server_that_stays_down_costs_the_save_not_the_training",
    ) {
        return;
    }
    log();
    let b = bucket("down");
    let mut job = Job::new();
    let mut ckpts = open(&b, None);
    job.step(0);
    ckpts.save(&job.model, &job.opt, 1).unwrap();
    ckpts.wait().unwrap();
    b.proxy.set_always(Some(Fault::Status(500)));
    job.step(1);
    ckpts.save(&job.model, &job.opt, 2).unwrap();
    let loss = job.step(2);
    assert!(loss.is_finite(), "training goes on while the save fails");
    let err = ckpts.wait().unwrap_err().to_string();
    assert!(err.contains("step 2 was not saved"), "{err}");
    b.proxy.set_always(None);
    let steps: Vec<u64> = ckpts.list().unwrap().iter().map(|c| c.step).collect();
    assert_eq!(steps, [1], "the failed save left no checkpoint behind");
    // the next save, with the server back, commits
    ckpts.save(&job.model, &job.opt, 3).unwrap();
    assert_eq!(ckpts.wait().unwrap().unwrap().step, 3);
}

#[test]
fn a_save_still_writing_to_a_store_that_stopped_answering_is_skipped_not_waited_on() {
    // alone in a process of its own: it reads the process's log, where other tests would write
    if !run_alone(
        module_path!(),
        "a_save_still_writing_to_a_store_that_stopped_answering_is_skipped_not_waited_on",
    ) {
        return;
    }
    log();
    let b = bucket("held");
    let mut job = Job::new();
    let mut ckpts = open_waiting(&b, None, Duration::from_secs(2));
    job.step(0);
    ckpts.save(&job.model, &job.opt, 1).unwrap();
    ckpts.wait().unwrap();
    // the server stops answering: every request held 8 s (past the client's 2 s bound)
    b.proxy
        .set_always(Some(Fault::Delay(Duration::from_secs(8))));
    job.step(1);
    ckpts.save(&job.model, &job.opt, 2).unwrap();
    job.step(2);
    let started = std::time::Instant::now();
    ckpts.save(&job.model, &job.opt, 3).unwrap();
    let blocked = started.elapsed();
    // the loop waited its 2 s for the save still writing, then went on without this one
    assert!(
        blocked >= Duration::from_secs(2) && blocked < Duration::from_millis(2600),
        "{blocked:?}"
    );
    assert_eq!(logged("checkpoint of step 3 skipped"), 1);
    assert!(job.step(3).is_finite(), "training goes on");
    b.proxy.set_always(None);
    // the held save ends on its own (retried, or failed); the next due save commits
    let _ = ckpts.wait();
    ckpts.save(&job.model, &job.opt, 4).unwrap();
    assert_eq!(ckpts.wait().unwrap().unwrap().step, 4);
    let m = job.dev.metrics();
    assert!(m.checkpoint_failures >= 1, "{}", m.report());
    assert!(
        m.report().contains("not saved: failed or skipped"),
        "{}",
        m.report()
    );
}

#[test]
fn a_missing_bucket_or_refused_credentials_fail_at_open() {
    let m = moto();
    let options = |endpoint: String| CheckpointOptions {
        s3: Some(S3Options {
            timeout: Duration::from_secs(2),
            retry_timeout: Duration::ZERO,
            endpoint: Some(endpoint),
            credentials: Some(("testing".into(), "testing".into())),
            ..S3Options::default()
        }),
        ..Default::default()
    };
    let e = Checkpoints::open("s3://npc-no-such-bucket/x", options(m.endpoint()))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("does not exist"), "{e}");
    let name = new_bucket(&m, "denied");
    let p = Proxy::start(m.port);
    p.set_always(Some(Fault::Status(403)));
    let e = Checkpoints::open(&format!("s3://{name}/x"), options(p.endpoint()))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("access denied"), "{e}");
}

#[test]
fn a_store_that_never_answers_fails_a_save_in_seconds_not_minutes() {
    let b = bucket("black-hole");
    let mut job = Job::new();
    let options = CheckpointOptions {
        background: false,
        parts: PartOptions {
            part_size: 5 << 20,
            concurrency: 2,
            attempts: 2,
            backoff: Duration::from_millis(50),
        },
        s3: Some(S3Options {
            // the whole-request bound of a checkpoint's requests; the answer's is 1 s here
            timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(1),
            retry_timeout: Duration::ZERO,
            answer_timeout: Some(Duration::from_secs(1)),
            endpoint: Some(b.proxy.endpoint()),
            credentials: Some(("testing".into(), "testing".into())),
            ..S3Options::default()
        }),
        ..Default::default()
    };
    let mut ckpts = Checkpoints::open(&b.url, options).unwrap();
    job.step(0);
    ckpts.save(&job.model, &job.opt, 1).unwrap();
    // a black hole: every request is taken and never answered (for 10 minutes)
    b.proxy
        .set_always(Some(Fault::Delay(Duration::from_secs(600))));
    job.step(1);
    let started = std::time::Instant::now();
    let err = ckpts.save(&job.model, &job.opt, 2).unwrap_err().to_string();
    let took = started.elapsed();
    b.proxy.set_always(None);
    assert!(err.contains("no answer within 1.0 s"), "{err}");
    // each request: 1 s, tried twice; a whole-request bound would have taken 120 s a try
    assert!(took < Duration::from_secs(15), "{took:?}");
    let steps: Vec<u64> = ckpts.list().unwrap().iter().map(|c| c.step).collect();
    assert_eq!(steps, [1]);
}
