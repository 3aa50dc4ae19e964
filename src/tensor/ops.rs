//! The tensor operations users call, in PyTorch / tch / candle naming. Each method records
//! primitives of the IR; broadcasting is made explicit here so the IR stays simple.

use std::panic::Location;

use neuron_pc_compiler::ir::{BinaryOp, CompareOp, Literal, Op, ReduceOp, UnaryOp};
use neuron_pc_compiler::DType;

use super::shape::{broadcast_shape, dim_index, promote};
use super::Tensor;
use crate::error::Result;

macro_rules! unary_methods {
    ($($(#[$m:meta])* $name:ident => $op:ident),+ $(,)?) => {
        impl Tensor {
            $(
                $(#[$m])*
                #[track_caller]
                pub fn $name(&self) -> Result<Tensor> {
                    Tensor::apply(Op::Unary(UnaryOp::$op), &[self])
                }
            )+
        }
    };
}

unary_methods! {
    /// `-x`
    neg => Neg,
    /// `|x|`
    abs => Abs,
    /// -1, 0 or 1
    sign => Sign,
    /// `e^x`
    exp => Exp,
    /// Natural logarithm.
    log => Log,
    /// `log(1 + x)`, accurate near 0.
    log1p => Log1p,
    /// Hyperbolic tangent.
    tanh => Tanh,
    /// `1 / (1 + exp(-x))`
    sigmoid => Logistic,
    /// Square root.
    sqrt => Sqrt,
    /// `1 / sqrt(x)`
    rsqrt => Rsqrt,
    /// Sine (of radians).
    sin => Sin,
    /// Cosine (of radians).
    cos => Cos,
    /// The error function.
    erf => Erf,
    /// The complementary error function, `1 - erf(x)` (`torch.special.erfc`), accurate where
    /// erf is close to 1.
    erfc => Erfc,
    /// Rounds down to a whole number (the dtype is kept).
    floor => Floor,
    /// Rounds up to a whole number (the dtype is kept).
    ceil => Ceil,
    /// Logical (pred) or bitwise (integer) not.
    logical_not => Not,
}

macro_rules! binary_methods {
    ($($(#[$m:meta])* $name:ident => $variant:ident($kind:ident :: $op:ident)),+ $(,)?) => {
        impl Tensor {
            $(
                $(#[$m])*
                #[track_caller]
                pub fn $name(&self, rhs: &Tensor) -> Result<Tensor> {
                    self.broadcast_binary(Op::$variant($kind::$op), rhs, Location::caller())
                }
            )+
        }
    };
}

binary_methods! {
    /// Elementwise sum, with NumPy broadcasting (as every binary op here).
    add => Binary(BinaryOp::Add),
    /// Elementwise difference, `self - rhs`.
    sub => Binary(BinaryOp::Sub),
    /// Elementwise product.
    mul => Binary(BinaryOp::Mul),
    /// Elementwise quotient, `self / rhs`; integer division truncates toward zero.
    div => Binary(BinaryOp::Div),
    /// Remainder with the sign of the dividend (C `fmod`).
    rem => Binary(BinaryOp::Rem),
    /// `self` to the power `rhs`, elementwise (`torch.pow`).
    pow => Binary(BinaryOp::Pow),
    /// Elementwise maximum (`torch.maximum`); a NaN in either operand gives NaN.
    maximum => Binary(BinaryOp::Max),
    /// Elementwise minimum (`torch.minimum`); a NaN in either operand gives NaN.
    minimum => Binary(BinaryOp::Min),
    /// Logical (pred) or bitwise (integer) and.
    logical_and => Binary(BinaryOp::And),
    /// Logical (pred) or bitwise (integer) or.
    logical_or => Binary(BinaryOp::Or),
    /// Logical (pred) or bitwise (integer) exclusive or.
    logical_xor => Binary(BinaryOp::Xor),
    /// `self == rhs`, elementwise, as a pred (boolean) tensor.
    eq => Compare(CompareOp::Eq),
    /// `self != rhs`, elementwise, as a pred tensor.
    ne => Compare(CompareOp::Ne),
    /// `self < rhs`, elementwise, as a pred tensor.
    lt => Compare(CompareOp::Lt),
    /// `self <= rhs`, elementwise, as a pred tensor.
    le => Compare(CompareOp::Le),
    /// `self > rhs`, elementwise, as a pred tensor.
    gt => Compare(CompareOp::Gt),
    /// `self >= rhs`, elementwise, as a pred tensor.
    ge => Compare(CompareOp::Ge),
}

impl Tensor {
    pub(crate) fn broadcast_binary(
        &self,
        op: Op,
        rhs: &Tensor,
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let dims = broadcast_shape(op.name(), self.dims(), rhs.dims(), location)?;
        let (a, b) = Tensor::promoted(self, rhs, location)?;
        let a = a.broadcast_to_at(&dims, location)?;
        let b = b.broadcast_to_at(&dims, location)?;
        Tensor::apply_at(op, &[&a, &b], location)
    }

    /// Both operands converted to their common dtype (PyTorch's type promotion).
    pub(crate) fn promoted(
        a: &Tensor,
        b: &Tensor,
        location: &'static Location<'static>,
    ) -> Result<(Tensor, Tensor)> {
        let common = promote(a.dtype(), b.dtype());
        let convert = |t: &Tensor| -> Result<Tensor> {
            if t.dtype() == common {
                Ok(t.clone())
            } else {
                Tensor::apply_at(Op::Convert(common), &[t], location)
            }
        };
        Ok((convert(a)?, convert(b)?))
    }

    /// Broadcasts to `dims` (NumPy rules).
    #[track_caller]
    pub fn broadcast_to(&self, dims: &[usize]) -> Result<Tensor> {
        self.broadcast_to_at(dims, Location::caller())
    }

    pub(crate) fn broadcast_to_at(
        &self,
        dims: &[usize],
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        if self.dims() == dims {
            return Ok(self.clone());
        }
        let offset = dims.len().saturating_sub(self.rank());
        // Dimensions of size 1 that stretch are dropped first, so broadcast_in_dim maps each
        // remaining dimension onto an equal one.
        let keep: Vec<usize> = (0..self.rank())
            .filter(|&i| self.dims()[i] == dims.get(i + offset).copied().unwrap_or(0))
            .collect();
        let src = if keep.len() == self.rank() {
            self.clone()
        } else {
            let kept: Vec<usize> = keep.iter().map(|&i| self.dims()[i]).collect();
            Tensor::apply_at(Op::Reshape { dims: kept }, &[self], location)?
        };
        let broadcast_dimensions: Vec<usize> = keep.iter().map(|&i| i + offset).collect();
        Tensor::apply_at(
            Op::BroadcastInDim {
                dims: dims.to_vec(),
                broadcast_dimensions,
            },
            &[&src],
            location,
        )
    }

    /// A constant of this tensor's dtype, recorded on its device (part of the graph: use
    /// [`crate::LazyDevice::scalar`] for values that change between steps).
    #[track_caller]
    pub fn constant_like(&self, value: f64) -> Result<Tensor> {
        let dev = self.device_inner()?;
        Tensor::apply_nullary(&dev, Op::Constant(Literal::splat(self.dtype(), value, &[])))
    }

    /// `self + value` (a constant of the graph).
    #[track_caller]
    pub fn add_scalar(&self, value: f64) -> Result<Tensor> {
        self.scalar_op(BinaryOp::Add, value, Location::caller())
    }

    /// `self * value` (a constant of the graph).
    #[track_caller]
    pub fn mul_scalar(&self, value: f64) -> Result<Tensor> {
        self.scalar_op(BinaryOp::Mul, value, Location::caller())
    }

    /// `self ^ value` (a constant of the graph).
    #[track_caller]
    pub fn powf(&self, value: f64) -> Result<Tensor> {
        self.scalar_op(BinaryOp::Pow, value, Location::caller())
    }

    /// `max(self, 0)`
    #[track_caller]
    pub fn relu(&self) -> Result<Tensor> {
        self.scalar_op(BinaryOp::Max, 0.0, Location::caller())
    }

    /// `self op value` with `value` recorded as one splat constant of this tensor's type (one
    /// node, not a scalar and its broadcast).
    fn scalar_op(
        &self,
        op: BinaryOp,
        value: f64,
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let dev = self.device_inner()?;
        let cell = dev.record_scalar_op(op, self.value(), &self.cell.ty, value, location)?;
        Ok(Tensor { cell })
    }

    /// `cond ? on_true : on_false`, elementwise with broadcasting; `cond` is pred.
    #[track_caller]
    pub fn where_cond(cond: &Tensor, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        let location = Location::caller();
        let d1 = broadcast_shape("select", cond.dims(), on_true.dims(), location)?;
        let dims = broadcast_shape("select", &d1, on_false.dims(), location)?;
        let (t, f) = Tensor::promoted(on_true, on_false, location)?;
        let c = cond.broadcast_to_at(&dims, location)?;
        let t = t.broadcast_to_at(&dims, location)?;
        let f = f.broadcast_to_at(&dims, location)?;
        Tensor::apply_at(Op::Select, &[&c, &t, &f], location)
    }

    /// Converts to `dtype`.
    #[track_caller]
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        Tensor::apply(Op::Convert(dtype), &[self])
    }

    /// Same data, new shape (same element count).
    #[track_caller]
    pub fn reshape(&self, dims: &[usize]) -> Result<Tensor> {
        if dims == self.dims() {
            return Ok(self.clone());
        }
        Tensor::apply(
            Op::Reshape {
                dims: dims.to_vec(),
            },
            &[self],
        )
    }

    /// Reorders dimensions: output dimension `i` is input dimension `perm[i]` (negative
    /// entries count from the end, as in `torch.permute`).
    #[track_caller]
    pub fn permute(&self, perm: &[isize]) -> Result<Tensor> {
        let location = Location::caller();
        let perm: Vec<usize> = perm
            .iter()
            .map(|&d| dim_index("permute", d, self.dims(), location))
            .collect::<Result<_>>()?;
        Tensor::apply_at(Op::Transpose { perm }, &[self], location)
    }

    /// [`Tensor::permute`] with dimensions already resolved (the gradient rules use it).
    #[track_caller]
    pub(crate) fn permute_dims(&self, perm: &[usize]) -> Result<Tensor> {
        Tensor::apply(
            Op::Transpose {
                perm: perm.to_vec(),
            },
            &[self],
        )
    }

    /// Swaps two dimensions (negative indices count from the end).
    #[track_caller]
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        let location = Location::caller();
        let a = dim_index("transpose", d0, self.dims(), location)?;
        let b = dim_index("transpose", d1, self.dims(), location)?;
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        Tensor::apply_at(Op::Transpose { perm }, &[self], location)
    }

    /// `len` entries of dimension `dim` starting at `start`.
    #[track_caller]
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Tensor> {
        let location = Location::caller();
        let d = dim_index("narrow", dim, self.dims(), location)?;
        let start_v: Vec<usize> = (0..self.rank())
            .map(|i| if i == d { start } else { 0 })
            .collect();
        let limit: Vec<usize> = (0..self.rank())
            .map(|i| if i == d { start + len } else { self.dims()[i] })
            .collect();
        Tensor::apply_at(
            Op::Slice {
                start: start_v,
                limit,
                stride: vec![1; self.rank()],
            },
            &[self],
            location,
        )
    }

    pub(crate) fn reduce(
        &self,
        op: ReduceOp,
        dims: &[isize],
        keepdim: bool,
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let mut ds: Vec<usize> = dims
            .iter()
            .map(|&d| dim_index(op.name(), d, self.dims(), location))
            .collect::<Result<_>>()?;
        ds.sort_unstable();
        ds.dedup();
        let reduced = Tensor::apply_at(Op::Reduce(op, ds.clone()), &[self], location)?;
        if !keepdim {
            return Ok(reduced);
        }
        let kept: Vec<usize> = (0..self.rank())
            .map(|i| if ds.contains(&i) { 1 } else { self.dims()[i] })
            .collect();
        Tensor::apply_at(Op::Reshape { dims: kept }, &[&reduced], location)
    }

    /// Sum over `dims`.
    #[track_caller]
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, dims, keepdim, Location::caller())
    }

    /// Sum of every element.
    #[track_caller]
    pub fn sum_all(&self) -> Result<Tensor> {
        let all: Vec<isize> = (0..self.rank() as isize).collect();
        self.reduce(ReduceOp::Sum, &all, false, Location::caller())
    }

    /// Mean over `dims`.
    #[track_caller]
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let location = Location::caller();
        let n: usize = dims
            .iter()
            .map(|&d| dim_index("mean", d, self.dims(), location).map(|i| self.dims()[i]))
            .collect::<Result<Vec<_>>>()?
            .iter()
            .product();
        let s = self.reduce(ReduceOp::Sum, dims, keepdim, location)?;
        s.mul_scalar(1.0 / n.max(1) as f64)
    }

    /// Mean of every element.
    #[track_caller]
    pub fn mean_all(&self) -> Result<Tensor> {
        let all: Vec<isize> = (0..self.rank() as isize).collect();
        self.mean(&all, false)
    }

    /// Maximum over `dims`.
    #[track_caller]
    pub fn max(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, dims, keepdim, Location::caller())
    }

    /// Minimum over `dims`.
    #[track_caller]
    pub fn min(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, dims, keepdim, Location::caller())
    }

    /// Product over `dims`.
    #[track_caller]
    pub fn prod(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Prod, dims, keepdim, Location::caller())
    }

    /// Index of the maximum along `dim` (i32 indices, first on ties).
    #[track_caller]
    pub fn argmax(&self, dim: isize) -> Result<Tensor> {
        let location = Location::caller();
        let d = dim_index("argmax", dim, self.dims(), location)?;
        Tensor::apply_at(
            Op::ArgMax {
                dim: d,
                index_dtype: DType::I32,
            },
            &[self],
            location,
        )
    }

    /// Index of the minimum along `dim` (i32 indices, first on ties).
    #[track_caller]
    pub fn argmin(&self, dim: isize) -> Result<Tensor> {
        let location = Location::caller();
        let d = dim_index("argmin", dim, self.dims(), location)?;
        Tensor::apply_at(
            Op::ArgMin {
                dim: d,
                index_dtype: DType::I32,
            },
            &[self],
            location,
        )
    }

    /// Rows of this `[n, d]` table picked by integer `indices` of any shape: the result has
    /// shape `indices.dims() + [d]` (an embedding lookup). An index outside `0..n` is clamped
    /// into the table (XLA's gather), unless index checks are on
    /// ([`crate::DeviceConfig::check_indices`]), which report it as an error.
    #[track_caller]
    pub fn index_select_rows(&self, indices: &Tensor) -> Result<Tensor> {
        self.index_select_rows_as("index_select_rows", indices, Location::caller())
    }

    /// [`Tensor::index_select_rows`] for the user-facing op `op` called at `location`.
    pub(crate) fn index_select_rows_as(
        &self,
        op: &'static str,
        indices: &Tensor,
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let rows = Tensor::apply_at(Op::Gather, &[self, indices], location)?;
        indices.check_index_range(op, "indices", self.dims()[0], None, location)?;
        Ok(rows)
    }

    /// Adds `updates` (`indices.dims() + [d]`) into the rows of this `[n, d]` table named by
    /// `indices`, summing repeated rows (the gradient of [`Tensor::index_select_rows`]).
    #[track_caller]
    pub fn scatter_add_rows(&self, indices: &Tensor, updates: &Tensor) -> Result<Tensor> {
        Tensor::apply(Op::ScatterAdd, &[self, indices, updates])
    }
}

impl Tensor {
    /// `self @ weight^T + bias` with a PyTorch-layout `[out, in]` weight (no transpose is
    /// materialized: the contraction runs over the weight's second dimension).
    #[track_caller]
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let location = Location::caller();
        let r = self.rank();
        let y = Tensor::apply_at(
            Op::DotGeneral {
                lhs_batch: vec![],
                rhs_batch: vec![],
                lhs_contract: vec![r.saturating_sub(1)],
                rhs_contract: vec![1],
            },
            &[self, weight],
            location,
        )
        .map_err(|e| e.for_user_op("linear"))?;
        match bias {
            Some(b) => y.broadcast_binary(Op::Binary(BinaryOp::Add), b, location),
            None => Ok(y),
        }
    }
}
