//! A StableHLO program executed the way a training loop executes its step: the runtime's floor
//! under a lazy step, with no tracing, no step cut and no bookkeeping around the launch.
//!
//! The inputs start as zeros of each parameter's type. The parameters the program aliases to
//! an output (`tf.aliasing_output`, as neuron-pc's lowering and JAX's donated arguments write
//! it) are donated at each launch and replaced by that output, so parameters and optimizer state
//! are updated in place, as in training. `examples/hlo_steptime.rs` and `examples/bench_device.rs`
//! measure with it.

use super::{ArgType, Buffer, Client, CompileOptions, Device, Event, LoadedExecutable, Signature};
use crate::error::{Error, Result};
use crate::host::HostTensor;

/// Per parameter of `@main`, the output it is aliased to (`tf.aliasing_output = K`), if any;
/// `None` when the parameter list cannot be read or does not hold `params` parameters.
pub fn aliased_outputs(mlir: &str, params: usize) -> Option<Vec<Option<usize>>> {
    const MARK: &str = "tf.aliasing_output = ";
    let start = mlir.find("@main(")? + "@main(".len();
    let end = start + mlir[start..].find("->")?;
    let found: Vec<Option<usize>> = mlir[start..end]
        .split("%arg")
        .skip(1)
        .map(|p| {
            let at = p.find(MARK)? + MARK.len();
            let digits: String = p[at..].chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect();
    (found.len() == params).then_some(found)
}

/// A compiled step program, its current inputs and which outputs replace which inputs.
pub struct StepLoop {
    exe: LoadedExecutable,
    /// The client's first device, where the inputs live.
    device: Device,
    /// `@main`'s parameter types.
    params: Vec<ArgType>,
    inputs: Vec<Buffer>,
    /// Per input, the output that replaces it (donated inputs only).
    aliased: Vec<Option<usize>>,
    /// The inputs that are not donated.
    keep: Vec<usize>,
}

impl StepLoop {
    /// Compiles `mlir` on `client`, with zero inputs on its first device. `donate`: false keeps
    /// every input (each launch then copies what the program updates).
    pub fn new(
        client: &Client,
        mlir: &str,
        options: &CompileOptions,
        donate: bool,
    ) -> Result<StepLoop> {
        let sig = Signature::parse(mlir).ok_or_else(|| Error::InvalidGraph {
            message: "no readable @main signature".into(),
        })?;
        let aliased = if donate {
            aliased_outputs(mlir, sig.params.len()).ok_or_else(|| Error::InvalidGraph {
                message: "the aliasing of @main's parameters cannot be read".into(),
            })?
        } else {
            vec![None; sig.params.len()]
        };
        let exe = client.compile(mlir, options)?;
        let device = *client.devices().first().ok_or_else(|| Error::Argument {
            message: "the client has no device".into(),
        })?;
        let inputs = sig
            .params
            .iter()
            .map(|p| client.buffer_from_host(&HostTensor::zeros(p.dtype, &p.dims), device))
            .collect::<Result<_>>()?;
        let keep = (0..aliased.len())
            .filter(|&i| aliased[i].is_none())
            .collect();
        Ok(StepLoop {
            exe,
            device,
            params: sig.params,
            inputs,
            aliased,
            keep,
        })
    }

    /// Inputs donated at each launch, and inputs in all.
    pub fn donated(&self) -> (usize, usize) {
        (self.aliased.iter().flatten().count(), self.inputs.len())
    }

    /// The current inputs, in `@main`'s order (a donated one is the last launch's output).
    pub fn inputs(&self) -> &[Buffer] {
        &self.inputs
    }

    /// The type of each input, in `@main`'s order.
    pub fn input_types(&self) -> &[ArgType] {
        &self.params
    }

    /// Replaces input `i` (zeros at first) by `value`, of the same type.
    pub fn set_input(&mut self, i: usize, value: &HostTensor) -> Result<()> {
        let ty = self.params.get(i).ok_or_else(|| Error::Argument {
            message: format!("input {i} of {}", self.params.len()),
        })?;
        if (ty.dtype, &ty.dims[..]) != (value.dtype(), value.dims()) {
            return Err(Error::Argument {
                message: format!("input {i} is {ty}, not {}{:?}", value.dtype(), value.dims()),
            });
        }
        self.inputs[i] = self.inputs[i]
            .client()
            .buffer_from_host(value, self.device)?;
        Ok(())
    }

    /// Launches one execution and returns at once: the donated inputs are replaced by their
    /// outputs (the next launch reads them, ordered by the runtime); the outputs left (`None`
    /// where one became an input) and the event of the execution's completion.
    pub fn launch(&mut self) -> Result<(Vec<Option<Buffer>>, Option<Event>)> {
        let refs: Vec<&Buffer> = self.inputs.iter().collect();
        let launched = self.exe.launch(&refs, &self.keep)?;
        let mut outputs: Vec<Option<Buffer>> = launched.outputs.into_iter().map(Some).collect();
        for (i, a) in self.aliased.iter().enumerate() {
            if let Some(o) = a.and_then(|k| outputs.get_mut(k)).and_then(Option::take) {
                self.inputs[i] = o;
            }
        }
        Ok((outputs, launched.done))
    }

    /// One step as a synced training loop runs it: launched, waited for, and its smallest
    /// output left (a loss) read back to the host; the updated state stays on the device.
    pub fn synced(&mut self) -> Result<()> {
        let (outputs, done) = self.launch()?;
        if let Some(done) = done {
            done.wait()?;
        }
        if let Some(b) = outputs.iter().flatten().min_by_key(|b| b.size_in_bytes()) {
            b.to_host()?;
        }
        Ok(())
    }

    /// `n` steps launched back to back with one wait at the end (a loop that reads nothing
    /// between steps).
    pub fn pipelined(&mut self, n: usize) -> Result<()> {
        let mut last = None;
        for _ in 0..n {
            last = self.launch()?.1;
        }
        match last {
            Some(done) => done.wait(),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::aliased_outputs;

    #[test]
    fn aliasing_read_per_parameter() {
        let text = "func.func public @main(%arg0: tensor<4xf32> {tf.aliasing_output = 1 : i32}, \
                    %arg1: tensor<i32>, %arg2: tensor<2xf32> {tf.aliasing_output = 0 : i32}) \
                    -> (tensor<2xf32>, tensor<4xf32>) {";
        assert_eq!(aliased_outputs(text, 3), Some(vec![Some(1), None, Some(0)]));
        // A count that disagrees with the signature is not guessed at.
        assert_eq!(aliased_outputs(text, 2), None);
        assert_eq!(aliased_outputs("no main here", 0), None);
    }
}
