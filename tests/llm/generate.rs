//! `LlamaForCausalLM::generate` against `transformers`' greedy `generate`
//! (`scripts/fixtures/generate.py`): the models trained 30 steps by tests/llm/llama.rs and
//! tests/llm/families.rs, three prompts as one left-padded batch, 32 new tokens, equal token for
//! token (the fixture records how far from a tie each greedy step was: at least 2.5e-3).

use crate::torch_fixture;

use std::path::{Path, PathBuf};

use neuron_pc::models::llama::{GenerateOptions, LlamaForCausalLM, LoadOptions, Sampling};
use neuron_pc::nn::HostRng;
use torch_fixture::Fixture;

const CASES: [(&str, &str); 7] = [
    ("llama", "llama-saved-by-rust"),
    ("mistral", "families/mistral-saved-by-rust"),
    ("qwen2", "families/qwen2-saved-by-rust"),
    ("qwen3", "families/qwen3-saved-by-rust"),
    ("dynamic", "families/dynamic-saved-by-rust"),
    ("qwen3_moe", "families/qwen3_moe-saved-by-rust"),
    ("mixtral", "families/mixtral-saved-by-rust"),
];

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

/// The fixture's prompts of `case` (unpadded) and transformers' new tokens.
fn prompts_and_tokens(fx: &Fixture, case: &str) -> (Vec<Vec<i32>>, Vec<Vec<i32>>) {
    let padded: Vec<i32> = fx.host(&format!("{case}.prompts")).to_vec().unwrap();
    let lengths: Vec<i32> = fx.host(&format!("{case}.lengths")).to_vec().unwrap();
    let width = padded.len() / lengths.len();
    let prompts = lengths
        .iter()
        .enumerate()
        .map(|(r, &n)| padded[(r + 1) * width - n as usize..(r + 1) * width].to_vec())
        .collect();
    let tokens: Vec<i32> = fx.host(&format!("{case}.tokens")).to_vec().unwrap();
    let new = tokens.len() / lengths.len();
    (prompts, tokens.chunks(new).map(<[i32]>::to_vec).collect())
}

fn options() -> GenerateOptions {
    let mut o = GenerateOptions::greedy(32);
    o.buckets = vec![16, 32];
    o
}

/// [`options`] sampling with these settings.
fn sampled(
    temperature: f64,
    top_k: Option<usize>,
    top_p: Option<f64>,
    seed: u64,
) -> GenerateOptions {
    let mut o = options();
    o.sampling = Sampling::Sample {
        temperature,
        top_k,
        top_p,
        seed,
    };
    o
}

#[test]
fn greedy_generation_matches_transformers_token_for_token() {
    let fx = Fixture::load("generate");
    for (case, dir) in CASES {
        let (prompts, want) = prompts_and_tokens(&fx, case);
        let model = LlamaForCausalLM::from_pretrained(&fx.dev, &data(dir)).unwrap();
        let got = model.generate(&prompts, &options()).unwrap();
        assert_eq!(got, want, "{case}");
        eprintln!("{case}: 3 x 32 tokens as transformers'");
    }
}

/// One prefill graph per bucket and one decode graph for every step of every bucket; the
/// same with the layers scanned (the loop unrolled for the per-layer caches).
#[test]
fn one_prefill_graph_per_bucket_and_one_decode_graph() {
    let fx = Fixture::load("generate");
    let (prompts, want) = prompts_and_tokens(&fx, "llama");
    let model = LlamaForCausalLM::from_pretrained(&fx.dev, &data("llama-saved-by-rust")).unwrap();
    let compiles = || fx.dev.metrics().compiles;
    let before = compiles();
    assert_eq!(model.generate(&prompts, &options()).unwrap(), want);
    assert_eq!(
        compiles() - before,
        2,
        "a prefill graph (bucket 16) and a decode graph"
    );
    // a prompt of 20 tokens makes the batch bucket 32: one more prefill graph, the same
    // decode graph (the cache is sized by the largest bucket), the other rows unchanged
    let long: Vec<i32> = (0..20).map(|i| (i * 5 + 1) % 128).collect();
    let batch = [prompts[0].clone(), prompts[1].clone(), long];
    let got = model.generate(&batch, &options()).unwrap();
    assert_eq!(compiles() - before, 3);
    assert_eq!(got[..2], want[..2]);
    assert_eq!(got[2].len(), 32);
    model.generate(&batch, &options()).unwrap();
    assert_eq!(compiles() - before, 3, "nothing new");

    let options_scan = LoadOptions {
        scan_layers: true,
        ..LoadOptions::default()
    };
    let scanned = LlamaForCausalLM::from_pretrained_with(
        &fx.dev,
        &data("llama-saved-by-rust"),
        &options_scan,
    )
    .unwrap();
    assert_eq!(scanned.generate(&prompts, &options()).unwrap(), want);
}

#[test]
fn sampling_is_seeded_and_its_limits_reduce_to_greedy() {
    let fx = Fixture::load("generate");
    let (prompts, want) = prompts_and_tokens(&fx, "qwen3");
    let model =
        LlamaForCausalLM::from_pretrained(&fx.dev, &data("families/qwen3-saved-by-rust")).unwrap();
    let sample = |temperature: f64, top_k: Option<usize>, top_p: Option<f64>, seed: u64| {
        model
            .generate(&prompts, &sampled(temperature, top_k, top_p, seed))
            .unwrap()
    };
    assert_eq!(sample(1.0, Some(1), None, 1), want, "top_k 1 is greedy");
    assert_eq!(
        sample(1.0, None, Some(1e-9), 2),
        want,
        "a tiny top_p is greedy"
    );
    let a = sample(2.0, None, None, 7);
    assert_eq!(
        a,
        sample(2.0, None, None, 7),
        "the same seed, the same tokens"
    );
    assert_ne!(a, sample(2.0, None, None, 8), "another seed, other tokens");
    assert_ne!(a, want, "sampling at temperature 2 is not greedy");
    // top_k 3: each drawn token is among the 3 most likely after its prefix (the model's
    // logits over prompt + drawn tokens, one forward pass), and not always the first
    let drawn = sample(1.5, Some(3), None, 3);
    let mut ids = prompts[0].clone();
    ids.extend(&drawn[0][..31]);
    let n = ids.len();
    let input = fx.dev.from_slice(&ids, &[1, n]).unwrap();
    let logits = model.forward(&input, None, None).unwrap();
    let logits: Vec<f32> = logits.to_vec().unwrap();
    let mut not_first = 0;
    for (i, &t) in drawn[0].iter().enumerate() {
        let at = prompts[0].len() - 1 + i;
        let row = &logits[at * 128..(at + 1) * 128];
        let rank = row.iter().filter(|v| **v > row[t as usize]).count();
        assert!(rank < 3, "step {i}: token {t} ranks {rank}");
        not_first += usize::from(rank > 0);
    }
    assert!(
        not_first > 0,
        "top_k 3 at temperature 1.5 drew only the most likely tokens"
    );
}

/// Sampling picks on the device; the host sampler (`Sampling::pick_on_host`), replayed with
/// the same seed over the model's logits at each drawn position (one forward pass per row over
/// its prompt and drawn tokens), must draw the same tokens, row after row, step after step.
#[test]
fn device_sampling_draws_what_the_host_sampler_draws_with_the_same_seed() {
    let fx = Fixture::load("generate");
    let (prompts, _) = prompts_and_tokens(&fx, "qwen3");
    let model =
        LlamaForCausalLM::from_pretrained(&fx.dev, &data("families/qwen3-saved-by-rust")).unwrap();
    let vocab = 128;
    // each row's logits at every position of its prompt and drawn tokens
    let row_logits = |prompt: &[i32], drawn: &[i32]| -> Vec<f64> {
        let mut ids = prompt.to_vec();
        ids.extend(drawn);
        let input = fx.dev.from_slice(&ids, &[1, ids.len()]).unwrap();
        let logits = model.forward(&input, None, None).unwrap();
        logits.to_host().unwrap().to_f64_vec()
    };
    let settings = [
        (1.0, None, None, 5),
        (0.7, Some(20), None, 6),
        (1.2, None, Some(0.9), 9),
        (1.5, Some(40), Some(0.8), 10),
    ];
    for (temperature, top_k, top_p, seed) in settings {
        let o = sampled(temperature, top_k, top_p, seed);
        let drawn = model.generate(&prompts, &o).unwrap();
        let logits: Vec<Vec<f64>> = prompts
            .iter()
            .zip(&drawn)
            .map(|(p, d)| row_logits(p, d))
            .collect();
        let mut rng = HostRng::new(seed);
        for step in 0..32 {
            for (r, (prompt, tokens)) in prompts.iter().zip(&drawn).enumerate() {
                let at = prompt.len() - 1 + step;
                let row = &logits[r][at * vocab..(at + 1) * vocab];
                let host = o.sampling.pick_on_host(row, Some(&mut rng));
                assert_eq!(
                    tokens[step], host,
                    "{temperature} {top_k:?} {top_p:?}: row {r} step {step}"
                );
            }
        }
        eprintln!("{temperature} {top_k:?} {top_p:?} seed {seed}: 3 x 32 draws as the host's");
    }
}

#[test]
fn an_end_token_ends_its_row_only() {
    let fx = Fixture::load("generate");
    let (prompts, want) = prompts_and_tokens(&fx, "llama");
    let model = LlamaForCausalLM::from_pretrained(&fx.dev, &data("llama-saved-by-rust")).unwrap();
    let eos = want[0][5];
    let mut o = options();
    o.eos_token_ids = vec![eos];
    let got = model.generate(&prompts, &o).unwrap();
    for (g, w) in got.iter().zip(&want) {
        let end = w.iter().position(|t| *t == eos).map_or(w.len(), |p| p + 1);
        assert_eq!(g[..], w[..end]);
    }
    assert!(got[0].len() <= 6);
}

#[test]
fn bad_requests_are_one_line_errors() {
    let fx = Fixture::load("generate");
    let model = LlamaForCausalLM::from_pretrained(&fx.dev, &data("llama-saved-by-rust")).unwrap();
    let long = vec![1; 40];
    let mut hot = options();
    hot.sampling = Sampling::Sample {
        temperature: 0.0,
        top_k: None,
        top_p: None,
        seed: 0,
    };
    let mut none = options();
    none.max_new_tokens = 0;
    for (prompts, o, needle) in [
        (vec![], options(), "no prompts"),
        (vec![vec![]], options(), "prompt 0 is empty"),
        (
            vec![vec![1, 500]],
            options(),
            "token 500, outside the vocabulary of 128",
        ),
        (vec![long], options(), "longer than the largest bucket"),
        (vec![vec![1]], hot, "temperature 0"),
        (vec![vec![1]], none, "max_new_tokens"),
    ] {
        let e = model.generate(&prompts, &o).unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}
