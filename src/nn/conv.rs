//! Convolution layers with `torch.nn.Conv1d/Conv2d`'s parameter layout and default
//! initialisation (weight and bias uniform in ±1/sqrt(fan_in), fan_in = in/groups × kernel).

use neuron_pc_compiler::HostTensor;

use crate::device::LazyDevice;
use crate::error::Result;
use crate::nn::{HostRng, Module};
use crate::tensor::Tensor;

/// Geometry shared by [`Conv1d`] and [`Conv2d`] (per spatial dimension for the 2-d layer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvConfig<const K: usize> {
    /// Channels of the input.
    pub in_channels: usize,
    /// Channels of the output (the number of filters).
    pub out_channels: usize,
    /// Kernel size.
    pub kernel: [usize; K],
    /// Step between windows (default 1).
    pub stride: [usize; K],
    /// Zeros added at both ends of the input (default 0).
    pub padding: [usize; K],
    /// Spacing between kernel elements (default 1).
    pub dilation: [usize; K],
    /// Blocked connections: each group of `in_channels / groups` input channels feeds
    /// `out_channels / groups` outputs (default 1; both must divide).
    pub groups: usize,
    /// Whether the layer has a bias `[out_channels]` (default true).
    pub bias: bool,
}

impl<const K: usize> ConvConfig<K> {
    /// Stride 1, no padding, no dilation, one group, with a bias (PyTorch's defaults).
    pub fn new(in_channels: usize, out_channels: usize, kernel: [usize; K]) -> Self {
        ConvConfig {
            in_channels,
            out_channels,
            kernel,
            stride: [1; K],
            padding: [0; K],
            dilation: [1; K],
            groups: 1,
            bias: true,
        }
    }
}

/// The weight's dims `[out, in / groups, kernel..]` and PyTorch's init bound 1/sqrt(fan_in).
fn weight_dims<const K: usize>(c: &ConvConfig<K>) -> Result<(Vec<usize>, f64)> {
    if c.groups == 0
        || !c.in_channels.is_multiple_of(c.groups)
        || !c.out_channels.is_multiple_of(c.groups)
    {
        return Err(crate::Error::Config(format!(
            "Conv: groups ({}) must divide in_channels ({}) and out_channels ({})",
            c.groups, c.in_channels, c.out_channels
        )));
    }
    let per_group = c.in_channels / c.groups;
    let fan_in = per_group * c.kernel.iter().product::<usize>();
    let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
    let mut dims = vec![c.out_channels, per_group];
    dims.extend_from_slice(&c.kernel);
    Ok((dims, bound))
}

/// Weight `[out, in / groups, kernel..]` and optional bias `[out]`.
fn init<const K: usize>(
    device: &LazyDevice,
    rng: &mut HostRng,
    c: &ConvConfig<K>,
) -> Result<(Tensor, Option<Tensor>)> {
    let (dims, bound) = weight_dims(c)?;
    let n: usize = dims.iter().product();
    let weight = device.tensor(&HostTensor::from_slice(&rng.uniform_vec(n, bound), &dims)?)?;
    let bias = if c.bias {
        let b = rng.uniform_vec(c.out_channels, bound);
        Some(device.tensor(&HostTensor::from_slice(&b, &[c.out_channels])?)?)
    } else {
        None
    };
    Ok((weight, bias))
}

/// A convolution layer over `K` spatial dimensions; use the [`Conv1d`] and [`Conv2d`] names.
#[derive(Module)]
pub struct ConvLayer<const K: usize> {
    /// `[out_channels, in_channels / groups, kernel..]`.
    pub weight: Tensor,
    /// `[out_channels]`, or `None` when the config has no bias.
    pub bias: Option<Tensor>,
    /// The geometry the layer was built with.
    #[module(skip)]
    pub config: ConvConfig<K>,
}

/// `torch.nn.Conv1d`: `[n, in, l]` → `[n, out, l_out]`.
pub type Conv1d = ConvLayer<1>;
/// `torch.nn.Conv2d`: `[n, in, h, w]` → `[n, out, h_out, w_out]`.
pub type Conv2d = ConvLayer<2>;

impl<const K: usize> ConvLayer<K> {
    /// A layer with PyTorch's initialisation (weight and bias uniform in ±1/sqrt(fan_in)),
    /// drawn from `rng`; groups that do not divide the channels are an error.
    pub fn new(device: &LazyDevice, rng: &mut HostRng, config: ConvConfig<K>) -> Result<Self> {
        let (weight, bias) = init(device, rng, &config)?;
        Ok(ConvLayer {
            weight,
            bias,
            config,
        })
    }

    /// `weight` (and `bias`) under `vb`'s prefix, read from its checkpoint; with no
    /// checkpoint, PyTorch's initialisation.
    pub fn from_vb(vb: &super::VarBuilder, config: ConvConfig<K>) -> Result<Self> {
        let (dims, bound) = weight_dims(&config)?;
        let init = super::Init::Uniform { bound };
        let weight = vb.get(&dims, "weight", init)?;
        let bias = match config.bias {
            true => Some(vb.get(&[config.out_channels], "bias", init)?),
            false => None,
        };
        Ok(ConvLayer {
            weight,
            bias,
            config,
        })
    }
}

impl Conv1d {
    /// `x [n, in_channels, l]` → `[n, out_channels, l_out]`
    /// (`torch.nn.functional.conv1d`).
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        x.conv1d(
            &self.weight,
            self.bias.as_ref(),
            c.stride[0],
            c.padding[0],
            c.dilation[0],
            c.groups,
        )
    }
}

impl Conv2d {
    /// `x [n, in_channels, h, w]` → `[n, out_channels, h_out, w_out]`
    /// (`torch.nn.functional.conv2d`).
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        x.conv2d(
            &self.weight,
            self.bias.as_ref(),
            c.stride,
            c.padding,
            c.dilation,
            c.groups,
        )
    }
}
