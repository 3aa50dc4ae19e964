//! Checkpoints at scale (`neuron_pc::state::Checkpoints`), locally: a background save
//! holds the step it was taken at while training goes on, ZeRO-1 moments are written per
//! replica and load at any replica count, the newest K are kept, a resume picks the newest
//! complete checkpoint and falls back past a damaged one, and large states are several files
//! with Hugging Face's index.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use neuron_pc::compile::CacheConfig;
use neuron_pc::models::{SyntheticTask, TextEncoder, TextEncoderConfig};
use neuron_pc::nn::Module;
use neuron_pc::optim::{average_gradients, AdamW};
use neuron_pc::state::{CheckpointOptions, Checkpoints};
use neuron_pc::state_dict::StateDict;
use neuron_pc::tensor::Reduction;
use neuron_pc::{grad, state, DType, DeviceConfig, LazyDevice, Tensor};
use neuron_pc_test_support::paths::fresh_dir;

const BATCH: usize = 16;

fn config() -> TextEncoderConfig {
    TextEncoderConfig {
        vocab: 97,
        embed: 16,
        seq_len: 8,
        mlp: vec![32, 24],
        classes: 7,
    }
}

/// A model, its AdamW and the device, training the synthetic task one step at a time.
struct Job {
    dev: LazyDevice,
    model: TextEncoder,
    params: Vec<Tensor>,
    opt: AdamW,
    zero1: bool,
    task: SyntheticTask,
}

impl Job {
    fn new(replicas: usize, zero1: bool) -> Job {
        let dev = LazyDevice::new(DeviceConfig {
            cache: CacheConfig::disabled(),
            replicas,
            ..DeviceConfig::default()
        })
        .expect("cpu device: run scripts/setup");
        let model = TextEncoder::new(&dev, config(), 3).unwrap();
        let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
        let opt = match zero1 {
            true => AdamW::zero1(&dev, &params, 0.01).unwrap(),
            false => AdamW::new(&dev, &params, 0.01).unwrap(),
        };
        Job {
            dev,
            model,
            params,
            opt,
            zero1,
            task: SyntheticTask::new(config(), 5),
        }
    }

    /// Training step `i` (counting from 0); its loss.
    fn step(&mut self, i: u64) -> f64 {
        let b: Vec<Tensor> = (self.task.batch(0, i, BATCH).iter())
            .map(|h| self.dev.shard(h).unwrap())
            .collect();
        let loss = self.model.loss(&b[0], &b[1], &b[2]).unwrap();
        let g = grad(&loss, &self.params.iter().collect::<Vec<_>>()).unwrap();
        let g = if self.zero1 {
            g
        } else {
            average_gradients(&g).unwrap()
        };
        let lr = self.dev.scalar(2e-2, DType::F32).unwrap();
        self.opt.step(&self.params, &g, &lr).unwrap();
        let global = loss.all_reduce(Reduction::Mean).unwrap();
        self.dev.mark_step().unwrap();
        global.item().unwrap()
    }

    /// The whole training state, read synchronously (ZeRO-1 moments gathered).
    fn state(&self, step: u64) -> StateDict {
        state::training_state(&self.model, &self.opt, step).unwrap()
    }
}

fn open(dir: &Path, keep: Option<usize>, shard_size: u64) -> Checkpoints {
    let options = CheckpointOptions {
        keep,
        shard_size,
        ..Default::default()
    };
    Checkpoints::open(dir.to_str().unwrap(), options).unwrap()
}

fn steps(c: &Checkpoints) -> Vec<u64> {
    c.list().unwrap().iter().map(|c| c.step).collect()
}

fn manifest(dir: &Path, step: u64) -> serde_json::Value {
    let path = dir.join(format!("step-{step:08}")).join("manifest.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn a_background_save_holds_its_step_while_training_goes_on() {
    let dir = fresh_dir("npc-ckpt", "held");
    let mut plain = Job::new(1, false);
    let mut saving = Job::new(1, false);
    let mut ckpts = open(&dir, None, 2 << 30);
    for i in 0..3 {
        assert_eq!(saving.step(i), plain.step(i));
    }
    let want = saving.state(3);
    ckpts.save(&saving.model, &saving.opt, 3).unwrap();
    // the next steps update every parameter and moment while the writer reads them
    for i in 3..6 {
        assert_eq!(
            saving.step(i),
            plain.step(i),
            "step {i}: a save changes nothing"
        );
    }
    let saved = ckpts.wait().unwrap().expect("a save was in flight");
    assert_eq!(saved.step, 3);
    let got = ckpts.load(&saved).unwrap();
    assert_eq!(
        got, want,
        "the checkpoint is the state at step 3, not a later one"
    );
    assert_ne!(saving.state(6).tensors, want.tensors, "training moved on");
    let m = saving.dev.metrics();
    assert_eq!(m.checkpoint_saves, 1);
    let bytes = std::fs::metadata(dir.join("step-00000003/model-00001-of-00001.safetensors"))
        .unwrap()
        .len();
    assert_eq!(m.checkpoint_bytes, bytes);
    assert!(
        m.report().contains("checkpoints                1 saved"),
        "{}",
        m.report()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_failed_save_is_counted_as_failed_not_as_saved() {
    let dir = fresh_dir("npc-ckpt", "failed");
    std::fs::create_dir_all(&dir).unwrap();
    // a file where step 1's directory would go: that save cannot write
    std::fs::write(dir.join("step-00000001"), b"in the way").unwrap();
    let mut job = Job::new(1, false);
    let mut ckpts = open(&dir, None, 2 << 30);
    job.step(0);
    ckpts.save(&job.model, &job.opt, 1).unwrap();
    let err = ckpts.wait().unwrap_err().to_string();
    assert!(err.contains("was not saved"), "{err}");
    job.step(1);
    ckpts.save(&job.model, &job.opt, 2).unwrap();
    ckpts.wait().unwrap();
    assert_eq!(steps(&ckpts), [2]);
    let m = job.dev.metrics();
    assert_eq!((m.checkpoint_saves, m.checkpoint_failures), (1, 1));
    let report = m.report();
    assert!(
        report.contains("1 saved (1 not saved: failed or skipped)"),
        "{report}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_save_is_not_committed_once_another_job_holds_the_location() {
    let dir = fresh_dir("npc-ckpt", "lease");
    let mut job = Job::new(1, false);
    let mut ckpts = open(&dir, None, 2 << 30);
    job.step(0);
    ckpts.save(&job.model, &job.opt, 1).unwrap();
    ckpts.wait().unwrap();
    // another live process of this host takes the location's lease
    let mut other = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let lease = serde_json::json!({ "host": host.trim(), "pid": other.id(), "since": 0 });
    std::fs::write(dir.join(".lease.json"), lease.to_string()).unwrap();
    job.step(1);
    ckpts.save(&job.model, &job.opt, 2).unwrap();
    let err = ckpts.wait().unwrap_err().to_string();
    assert!(
        err.contains("another job took these checkpoints over"),
        "{err}"
    );
    assert_eq!(steps(&ckpts), [1]);
    // and a job that opens the location now is refused, naming the holder
    let e = Checkpoints::open(dir.to_str().unwrap(), Default::default())
        .err()
        .unwrap()
        .to_string();
    let holder = format!("another job writes checkpoints here (pid {}", other.id());
    assert!(e.contains(&holder), "{e}");
    drop(ckpts);
    // not ours: dropping ours leaves it
    assert!(dir.join(".lease.json").exists());
    other.kill().unwrap();
    other.wait().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn zero1_moments_are_written_per_replica_and_load_at_any_replica_count() {
    let dir = fresh_dir("npc-ckpt", "zero1");
    let mut four = Job::new(4, true);
    for i in 0..2 {
        four.step(i);
    }
    let mut ckpts = open(&dir, None, 2 << 30);
    ckpts.save(&four.model, &four.opt, 2).unwrap();
    let want = four.state(2);
    ckpts.wait().unwrap();
    // 24x32 = 768 elements: a block of 192 per replica, each its own chunk
    let m = manifest(&dir, 2);
    let w = "optimizer.mlp.2.weight.exp_avg";
    let chunks = m["tensors"][w]["chunks"].as_array().unwrap();
    let starts: Vec<u64> = chunks
        .iter()
        .map(|c| c["start"].as_u64().unwrap())
        .collect();
    assert_eq!(starts, [0, 192, 384, 576], "{}", m["tensors"][w]);
    // 7 elements over 4 replicas: blocks of 2, the last one's padding not written
    let b = &m["tensors"]["optimizer.proj.bias.exp_avg_sq"]["chunks"];
    let lens: Vec<u64> = (b.as_array().unwrap().iter())
        .map(|c| c["len"].as_u64().unwrap())
        .collect();
    assert_eq!(lens, [2, 2, 2, 1]);
    let info = &ckpts.list().unwrap()[0];
    assert_eq!(
        ckpts.load(info).unwrap(),
        want,
        "assembled = gathered on the device"
    );

    // continued at 4 replicas, and resumed at 2 with ZeRO-1 and at 1 without
    let reference: Vec<f64> = (2..4).map(|i| four.step(i)).collect();
    for (replicas, zero1) in [(2, true), (1, false)] {
        let mut job = Job::new(replicas, zero1);
        let r = ckpts.resume(&job.model, &job.opt).unwrap().unwrap();
        assert_eq!(r.checkpoint.step, 2);
        for (i, want) in (2..4).zip(&reference) {
            let got = job.step(i);
            assert!(
                (got - want).abs() <= 1e-5 * want.abs(),
                "{replicas} replicas, step {i}: {got} vs {want}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_newest_k_are_kept_and_resume_falls_back_past_a_damaged_one() {
    let dir = fresh_dir("npc-ckpt", "keep");
    let mut job = Job::new(1, false);
    let mut ckpts = open(&dir, Some(2), 2 << 30);
    let mut states = BTreeMap::new();
    for i in 0..4 {
        job.step(i);
        ckpts.save(&job.model, &job.opt, i + 1).unwrap();
        states.insert(i + 1, job.state(i + 1));
    }
    ckpts.wait().unwrap();
    assert_eq!(steps(&ckpts), [3, 4]);
    assert!(!dir.join("step-00000001").exists() && !dir.join("step-00000002").exists());

    // a save killed midway: files, no manifest; never listed, never read
    let partial = dir.join("step-00000005");
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(partial.join("model-00001-of-00001.safetensors"), b"half").unwrap();
    assert_eq!(steps(&ckpts), [3, 4]);

    // one flipped byte in the newest: the resume takes step 3, which is whole
    let shard = dir.join("step-00000004/model-00001-of-00001.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let at = bytes.len() - 10;
    bytes[at] ^= 1;
    std::fs::write(&shard, &bytes).unwrap();
    let info4 = ckpts.list().unwrap()[1].clone();
    let err = ckpts.load(&info4).unwrap_err().to_string();
    assert!(err.contains("SHA-256"), "{err}");
    let fresh = Job::new(1, false);
    let r = ckpts.resume(&fresh.model, &fresh.opt).unwrap().unwrap();
    assert_eq!(r.checkpoint.step, 3);
    assert_eq!(fresh.state(3), states[&3]);

    // saving step 4 again replaces the damaged one; the next commit prunes step 3 and the
    // unfinished step 5 is left to the save that reaches it
    let mut again = fresh;
    again.step(3);
    ckpts.save(&again.model, &again.opt, 4).unwrap();
    ckpts.wait().unwrap();
    assert_eq!(ckpts.load(&info4).unwrap(), again.state(4));
    assert_eq!(steps(&ckpts), [3, 4]);

    // a model that does not fit is an error, not a fallback
    let other = TextEncoder::new(
        &again.dev,
        TextEncoderConfig {
            embed: 8,
            ..config()
        },
        1,
    );
    let other = other.unwrap();
    let params: Vec<Tensor> = other.parameters().into_iter().map(|(_, t)| t).collect();
    let opt = AdamW::new(&again.dev, &params, 0.01).unwrap();
    let err = ckpts.resume(&other, &opt).unwrap_err().to_string();
    assert!(err.contains("does not match the model"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn large_states_are_several_files_with_a_hugging_face_index() {
    let dir = fresh_dir("npc-ckpt", "shards");
    let mut job = Job::new(1, false);
    job.step(0);
    // 97x16 f32 = 6208 bytes: the largest tensor; files of at most 8000 bytes of tensors
    let mut ckpts = open(&dir, None, 8000);
    ckpts.save(&job.model, &job.opt, 1).unwrap();
    let info = ckpts.wait().unwrap().unwrap();
    let step = dir.join(&info.name);
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(step.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let map = index["weight_map"].as_object().unwrap();
    let want = job.state(1);
    assert_eq!(
        map.len(),
        want.tensors.len(),
        "every tensor is stored whole"
    );
    let files: Vec<PathBuf> = (std::fs::read_dir(&step).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    assert!(files.len() >= 3, "{files:?}");
    let mut total = 0;
    for f in &files {
        let name = f.file_name().unwrap().to_str().unwrap().to_string();
        let n = files.len();
        assert!(name.ends_with(&format!("-of-{n:05}.safetensors")), "{name}");
        total += std::fs::metadata(f).unwrap().len();
        // what PyTorch's safetensors reads: every tensor the index puts here is here
        let sd = StateDict::load(f).unwrap();
        for (t, file) in map {
            if file == &name {
                assert_eq!(sd.tensors[t], want.tensors[t], "{t} in {name}");
            }
        }
        let bytes: usize = sd.tensors.values().map(|t| t.bytes().len()).sum();
        assert!(
            bytes <= 8000 || sd.tensors.len() == 1,
            "{name}: {bytes} bytes"
        );
    }
    assert_eq!(index["metadata"]["total_size"].as_u64(), Some(total));
    assert_eq!(ckpts.load(&info).unwrap(), want);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_directory_of_the_single_file_layout_resumes_and_moves_on_to_step_directories() {
    let dir = fresh_dir("npc-ckpt", "legacy");
    let mut job = Job::new(1, false);
    job.step(0);
    job.step(1);
    let want = job.state(2);
    want.save(&dir.join("last.safetensors")).unwrap();
    let mut ckpts = open(&dir, None, 2 << 30);
    let mut fresh = Job::new(1, false);
    let r = ckpts.resume(&fresh.model, &fresh.opt).unwrap().unwrap();
    assert_eq!(
        (r.checkpoint.name.as_str(), r.checkpoint.step),
        ("last.safetensors", 2)
    );
    assert_eq!(fresh.state(2), want);
    assert_eq!(fresh.step(2), job.step(2));
    ckpts.save(&fresh.model, &fresh.opt, 3).unwrap();
    ckpts.wait().unwrap();
    // step directories take over from the file
    let again = Job::new(1, false);
    let r = ckpts.resume(&again.model, &again.opt).unwrap().unwrap();
    assert_eq!(r.checkpoint.step, 3);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_locations_are_one_clear_error() {
    let file = fresh_dir("npc-ckpt", "file").join("f");
    std::fs::write(&file, b"x").unwrap();
    let e = Checkpoints::open(file.to_str().unwrap(), Default::default())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("it is a file"), "{e}");
    let keep0 = CheckpointOptions {
        keep: Some(0),
        ..Default::default()
    };
    let e = Checkpoints::open("/tmp/x", keep0)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("keeping 0"), "{e}");
    let e = Checkpoints::open("s3://No_Such", Default::default())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("bucket name"), "{e}");
    // said as a checkpoint location's, not in the compile cache's words
    assert!(
        e.contains("invalid checkpoint location") && !e.contains("cache"),
        "{e}"
    );
}
