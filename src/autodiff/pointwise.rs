//! Gradient rules of the pointwise ops: unary and binary arithmetic, select and convert.

use std::panic::Location;

use neuron_pc_compiler::ir::{BinaryOp, Op, UnaryOp};

use super::non_diff;
use crate::error::Result;
use crate::tensor::Tensor;

/// The cotangent of a unary op's operand `a` (result `y`, output cotangent `g`).
pub(super) fn unary(
    u: &UnaryOp,
    op: &Op,
    a: &Tensor,
    y: &Tensor,
    g: &Tensor,
    location: &'static Location<'static>,
) -> Result<Tensor> {
    Ok(match u {
        // d/dx -x = -1
        UnaryOp::Neg => g.neg()?,
        // d/dx |x| = sign(x)
        UnaryOp::Abs => g.mul(&a.sign()?)?,
        // piecewise constant: zero almost everywhere
        UnaryOp::Sign | UnaryOp::Floor | UnaryOp::Ceil => g.zeros_like()?,
        // d/dx e^x = e^x
        UnaryOp::Exp => g.mul(y)?,
        // d/dx ln x = 1/x
        UnaryOp::Log => g.div(a)?,
        // d/dx ln(1+x) = 1/(1+x)
        UnaryOp::Log1p => g.div(&a.add_scalar(1.0)?)?,
        // d/dx tanh x = 1 - tanh(x)^2
        UnaryOp::Tanh => g.mul(&y.mul(y)?.neg()?.add_scalar(1.0)?)?,
        // d/dx s(x) = s(x)(1 - s(x))
        UnaryOp::Logistic => g.mul(&y.mul(&y.neg()?.add_scalar(1.0)?)?)?,
        // d/dx sqrt x = 1/(2 sqrt x)
        UnaryOp::Sqrt => g.div(&y.mul_scalar(2.0)?)?,
        // d/dx x^-1/2 = -1/2 x^-3/2 = -y/(2x)
        UnaryOp::Rsqrt => g.mul(&y.div(a)?.mul_scalar(-0.5)?)?,
        // d/dx sin x = cos x
        UnaryOp::Sin => g.mul(&a.cos()?)?,
        // d/dx cos x = -sin x
        UnaryOp::Cos => g.mul(&a.sin()?.neg()?)?,
        // d/dx erf x = 2/sqrt(pi) e^(-x^2)
        UnaryOp::Erf => g.mul(
            &a.mul(a)?
                .neg()?
                .exp()?
                .mul_scalar(std::f64::consts::FRAC_2_SQRT_PI)?,
        )?,
        // d/dx erfc x = -2/sqrt(pi) e^(-x^2)
        UnaryOp::Erfc => g.mul(
            &a.mul(a)?
                .neg()?
                .exp()?
                .mul_scalar(-std::f64::consts::FRAC_2_SQRT_PI)?,
        )?,
        // logical/bitwise: no derivative
        UnaryOp::Not => return Err(non_diff(op, location)),
    })
}

/// The cotangents of a binary op's operands `a` and `c` (result `y`, output cotangent `g`).
pub(super) fn binary(
    b: &BinaryOp,
    op: &Op,
    x: &[Tensor],
    y: &Tensor,
    g: &Tensor,
    location: &'static Location<'static>,
) -> Result<(Tensor, Tensor)> {
    let (a, c) = (&x[0], &x[1]);
    if !a.dtype().is_float() {
        return Err(non_diff(op, location));
    }
    Ok(match b {
        // d(a + c) = da + dc
        BinaryOp::Add => (g.clone(), g.clone()),
        // d(a - c) = da - dc
        BinaryOp::Sub => (g.clone(), g.neg()?),
        // d(ac) = c da + a dc
        BinaryOp::Mul => (g.mul(c)?, g.mul(a)?),
        // d(a/c) = da/c - a/c^2 dc
        BinaryOp::Div => (g.div(c)?, g.mul(y)?.div(c)?.neg()?),
        // rem(a, c) = a - c trunc(a/c): da = 1, dc = -trunc(a/c)
        BinaryOp::Rem => {
            let q = a.sub(y)?.div(c)?;
            (g.clone(), g.mul(&q)?.neg()?)
        }
        // d(a^c) = c a^(c-1) da + a^c ln(a) dc
        BinaryOp::Pow => {
            let da = g.mul(c)?.mul(&a.pow(&c.add_scalar(-1.0)?)?)?;
            let dc = g.mul(y)?.mul(&a.log()?)?;
            (da, dc)
        }
        // d max(a, c) = da where a >= c, else dc (ties go to the left operand; min alike)
        BinaryOp::Max | BinaryOp::Min => {
            let pick_a = if *b == BinaryOp::Max {
                a.ge(c)?
            } else {
                a.le(c)?
            };
            let zero = g.zeros_like()?;
            (
                Tensor::where_cond(&pick_a, g, &zero)?,
                Tensor::where_cond(&pick_a, &zero, g)?,
            )
        }
        // logical/bitwise: no derivative
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => return Err(non_diff(op, location)),
    })
}

/// d select(p, t, f) = dt where p, df elsewhere (none into the pred).
pub(super) fn select(p: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let zero = g.zeros_like()?;
    Ok(vec![
        None,
        Some(Tensor::where_cond(p, g, &zero)?),
        Some(Tensor::where_cond(p, &zero, g)?),
    ])
}

/// d/dx convert(x) = g converted back (float to float only; integers get none).
pub(super) fn convert(a: &Tensor, y: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    Ok(if a.dtype().is_float() && y.dtype().is_float() {
        vec![Some(g.to_dtype(a.dtype())?)]
    } else {
        vec![None]
    })
}
