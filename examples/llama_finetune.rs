//! Fine-tunes a Hugging Face Llama checkpoint and saves it back: `llama_finetune IN OUT`.
use std::path::Path;

use neuron_pc::models::llama::LlamaForCausalLM;
use neuron_pc::nn::Module;
use neuron_pc::optim::AdamW;
use neuron_pc::{grad, DType, HostTensor, LazyDevice, Tensor};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, input, output] = &args[..] else {
        anyhow::bail!("usage: llama_finetune SAVE_PRETRAINED_DIR OUT_DIR");
    };
    let device = LazyDevice::from_env()?;
    // config.json + model.safetensors (or the sharded index), as save_pretrained writes them;
    // the weights are read straight into the layers, in float32 whatever the file's dtype
    let model = LlamaForCausalLM::from_pretrained_as(&device, Path::new(input), DType::F32)?;
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let param_refs: Vec<&Tensor> = params.iter().collect();
    let mut opt = AdamW::new(&device, &params, 0.1)?;
    let lr = device.scalar(1e-3, DType::F32)?;
    // two sequences of token ids (a tokenizer's output); labels = ids, shifted inside as
    // transformers does, -100 ignored
    let ids: Vec<i32> = (0..64).map(|i| i * 7 % 100).collect();
    for step in 0..20 {
        let ids = device.tensor(&HostTensor::from_slice(&ids, &[2, 32])?)?;
        let loss = model.loss(&ids, None, &ids)?;
        let grads = grad(&loss, &param_refs)?;
        opt.step(&params, &grads, &lr)?;
        device.mark_step()?; // one step graph: compiled once, then cached
        println!("step {step} loss {:.4}", loss.item()?);
    }
    // loads with transformers' LlamaForCausalLM.from_pretrained(OUT)
    model.save_pretrained(Path::new(output), DType::BF16)?;
    Ok(())
}
