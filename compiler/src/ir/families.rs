//! The fieldless op families (`UnaryOp`, `BinaryOp`, `CompareOp`, `ReduceOp`) and the facts
//! each carries: names, StableHLO spelling, the dtypes it takes.

use crate::dtype::DType;

/// Declares a fieldless op enum with `ALL`, every variant in declaration order, generated from
/// the declaration itself so that a new variant cannot be left out of it.
macro_rules! op_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident, )+
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: [$name; [$(stringify!($variant)),+].len()] = [$($name::$variant),+];
        }
    };
}

/// Which dtypes an elementwise op accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DTypeClass {
    /// f32, f64, bf16, f16.
    Float,
    /// Floats and signed integers.
    Signed,
    /// Floats and all integers (not pred).
    Numeric,
    /// Integers and pred (bitwise ops).
    Bits,
    /// Everything.
    Any,
}

impl DTypeClass {
    /// True when `d` is in the class.
    pub fn contains(self, d: DType) -> bool {
        match self {
            DTypeClass::Float => d.is_float(),
            DTypeClass::Signed => d.is_float() || d.is_signed_int(),
            DTypeClass::Numeric => d.is_float() || d.is_int(),
            DTypeClass::Bits => d.is_int() || d == DType::Pred,
            DTypeClass::Any => true,
        }
    }

    /// Every dtype in the class, in [`DType::ALL`] order.
    pub fn dtypes(self) -> Vec<DType> {
        DType::ALL
            .into_iter()
            .filter(|&d| self.contains(d))
            .collect()
    }

    /// The class in words, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            DTypeClass::Float => "a float dtype",
            DTypeClass::Signed => "a float or signed integer dtype",
            DTypeClass::Numeric => "a float or integer dtype",
            DTypeClass::Bits => "an integer or pred dtype",
            DTypeClass::Any => "any dtype",
        }
    }
}

/// Declares [`UnaryOp`] from one table: each row is every fact of one op, so a new unary op
/// is one row here, its derivative (`autodiff/pointwise.rs` in the root crate) and its
/// `Tensor` method. Rows give:
/// - `name`: the short lowercase name for messages;
/// - `stablehlo`: the op as spelled in MLIR text (`erf` comes from the CHLO dialect);
/// - `dtypes`: the [`DTypeClass`] it takes (the result has the operand's dtype);
/// - `half`: whether `--auto-cast all` may run it in bf16/fp16 (bounded or sign-like results
///   such as `tanh` or `erf`, not the range-hungry `exp`, `log`, `sqrt`);
/// - `cheap`: whether a scanned body's backward pass recomputes it rather than stacking it
///   (memory-bound work XLA fuses into its readers, not a transcendental function);
/// - `float`, `int`, `uint`: the reference value, floats in f64 (the reference evaluator rounds
///   to the dtype), integers wrapping; `None` where `dtypes` excludes them.
macro_rules! unary_ops {
    ($(
        $(#[$doc:meta])*
        $variant:ident {
            name: $name:literal,
            stablehlo: $hlo:literal,
            dtypes: $class:ident,
            half: $half:literal,
            cheap: $cheap:literal,
            float: $f:expr,
            int: $i:expr,
            uint: $u:expr,
        }
    )+) => {
        op_enum! {
        /// Elementwise one-operand ops.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum UnaryOp {
            $( $(#[$doc])* $variant, )+
        }
        }

        impl UnaryOp {
            /// A short lowercase name for messages.
            pub fn name(self) -> &'static str {
                match self { $( UnaryOp::$variant => $name, )+ }
            }

            /// The op as spelled in MLIR text (`erf` comes from the CHLO dialect).
            pub fn stablehlo_name(self) -> &'static str {
                match self { $( UnaryOp::$variant => $hlo, )+ }
            }

            /// Whether `--auto-cast all` may run it in bf16/fp16: bounded or sign-like results
            /// (`tanh`, `erf`, ...), not the range-hungry ones (`exp`, `log`, `sqrt`, `rsqrt`).
            pub fn half_precision_safe(self) -> bool {
                match self { $( UnaryOp::$variant => $half, )+ }
            }

            /// Whether recomputing it costs less than storing it: memory-bound work that XLA
            /// fuses into its readers (sign changes, rounding), not a transcendental function.
            pub fn cheap(self) -> bool {
                match self { $( UnaryOp::$variant => $cheap, )+ }
            }

            /// The dtypes the op takes (the result has the operand's dtype).
            pub fn dtypes(self) -> DTypeClass {
                match self { $( UnaryOp::$variant => DTypeClass::$class, )+ }
            }

            /// The exact value on a float, in f64 (the reference evaluator's).
            pub fn on_float(self, a: f64) -> f64 {
                let f: fn(f64) -> f64 = match self { $( UnaryOp::$variant => $f, )+ };
                f(a)
            }

            /// The value on a signed integer (wrapping), or `None` where the op takes no
            /// integers.
            pub fn on_int(self, a: i64) -> Option<i64> {
                let f: Option<fn(i64) -> i64> = match self { $( UnaryOp::$variant => $i, )+ };
                f.map(|f| f(a))
            }

            /// The value on an unsigned integer (wrapping), or `None` where the op takes no
            /// unsigned integers.
            pub fn on_uint(self, a: u64) -> Option<u64> {
                let f: Option<fn(u64) -> u64> = match self { $( UnaryOp::$variant => $u, )+ };
                f.map(|f| f(a))
            }
        }
    };
}

unary_ops! {
    /// `-x` (integers wrap).
    Neg {
        name: "neg", stablehlo: "stablehlo.negate", dtypes: Signed, half: true, cheap: true,
        float: |a| -a, int: Some(i64::wrapping_neg), uint: Some(u64::wrapping_neg),
    }
    /// `|x|` (integers wrap: `abs(MIN)` is `MIN`).
    Abs {
        name: "abs", stablehlo: "stablehlo.abs", dtypes: Signed, half: true, cheap: true,
        float: f64::abs, int: Some(i64::wrapping_abs), uint: None,
    }
    /// -1, 0 or 1 by the sign of `x`; a float zero keeps its sign and NaN stays NaN.
    Sign {
        name: "sign", stablehlo: "stablehlo.sign", dtypes: Signed, half: true, cheap: true,
        float: |a| if a.is_nan() || a == 0.0 { a } else { a.signum() },
        int: Some(i64::signum), uint: Some(|a| u64::from(a != 0)),
    }
    /// `e^x`.
    Exp {
        name: "exp", stablehlo: "stablehlo.exponential", dtypes: Float, half: false,
        cheap: false, float: f64::exp, int: None, uint: None,
    }
    /// Natural logarithm.
    Log {
        name: "log", stablehlo: "stablehlo.log", dtypes: Float, half: false, cheap: false,
        float: f64::ln, int: None, uint: None,
    }
    /// `log(1 + x)`, accurate for small x (PyTorch's `log1p`).
    Log1p {
        name: "log1p", stablehlo: "stablehlo.log_plus_one", dtypes: Float, half: false,
        cheap: false, float: f64::ln_1p, int: None, uint: None,
    }
    /// Hyperbolic tangent.
    Tanh {
        name: "tanh", stablehlo: "stablehlo.tanh", dtypes: Float, half: true, cheap: false,
        float: f64::tanh, int: None, uint: None,
    }
    /// The sigmoid `1 / (1 + e^-x)` (PyTorch's `sigmoid`).
    Logistic {
        name: "logistic", stablehlo: "stablehlo.logistic", dtypes: Float, half: true,
        cheap: false, float: |a| 1.0 / (1.0 + (-a).exp()), int: None, uint: None,
    }
    /// Square root.
    Sqrt {
        name: "sqrt", stablehlo: "stablehlo.sqrt", dtypes: Float, half: false, cheap: false,
        float: f64::sqrt, int: None, uint: None,
    }
    /// `1 / sqrt(x)`.
    Rsqrt {
        name: "rsqrt", stablehlo: "stablehlo.rsqrt", dtypes: Float, half: false, cheap: false,
        float: |a| 1.0 / a.sqrt(), int: None, uint: None,
    }
    /// Sine, in radians.
    Sin {
        name: "sin", stablehlo: "stablehlo.sine", dtypes: Float, half: true, cheap: false,
        float: f64::sin, int: None, uint: None,
    }
    /// Cosine, in radians.
    Cos {
        name: "cos", stablehlo: "stablehlo.cosine", dtypes: Float, half: true, cheap: false,
        float: f64::cos, int: None, uint: None,
    }
    /// The Gauss error function (CHLO's `chlo.erf`).
    Erf {
        name: "erf", stablehlo: "chlo.erf", dtypes: Float, half: true, cheap: false,
        float: crate::special::erf, int: None, uint: None,
    }
    /// `1 - erf(x)`, without the cancellation for large x.
    Erfc {
        name: "erfc", stablehlo: "chlo.erfc", dtypes: Float, half: true, cheap: false,
        float: crate::special::erfc, int: None, uint: None,
    }
    /// Rounds down to an integral value (the dtype stays a float).
    Floor {
        name: "floor", stablehlo: "stablehlo.floor", dtypes: Float, half: true, cheap: true,
        float: f64::floor, int: None, uint: None,
    }
    /// Rounds up to an integral value (the dtype stays a float).
    Ceil {
        name: "ceil", stablehlo: "stablehlo.ceil", dtypes: Float, half: true, cheap: true,
        float: f64::ceil, int: None, uint: None,
    }
    /// Logical not on pred, bitwise not on integers.
    Not {
        name: "not", stablehlo: "stablehlo.not", dtypes: Bits, half: false, cheap: true,
        float: |a| a, int: Some(|a| !a), uint: Some(|a| !a),
    }
}

op_enum! {
/// Elementwise two-operand ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinaryOp {
    /// `x + y` (integers wrap).
    Add,
    /// `x - y` (integers wrap).
    Sub,
    /// `x * y` (integers wrap).
    Mul,
    /// Integer division truncates toward zero.
    Div,
    /// Remainder with the dividend's sign (C `fmod` / `%`).
    Rem,
    /// `x^y`; on integers a negative exponent gives 0 (but for bases 1 and -1).
    Pow,
    /// NaN-propagating for floats.
    Max,
    /// NaN-propagating for floats.
    Min,
    /// Logical and on pred, bitwise and on integers.
    And,
    /// Logical or on pred, bitwise or on integers.
    Or,
    /// Logical xor on pred, bitwise xor on integers.
    Xor,
}
}

impl BinaryOp {
    /// A short lowercase name for messages.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Rem => "rem",
            BinaryOp::Pow => "pow",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::Xor => "xor",
        }
    }

    /// The StableHLO op that computes it.
    pub fn stablehlo_name(self) -> &'static str {
        match self {
            BinaryOp::Add => "stablehlo.add",
            BinaryOp::Sub => "stablehlo.subtract",
            BinaryOp::Mul => "stablehlo.multiply",
            BinaryOp::Div => "stablehlo.divide",
            BinaryOp::Rem => "stablehlo.remainder",
            BinaryOp::Pow => "stablehlo.power",
            BinaryOp::Max => "stablehlo.maximum",
            BinaryOp::Min => "stablehlo.minimum",
            BinaryOp::And => "stablehlo.and",
            BinaryOp::Or => "stablehlo.or",
            BinaryOp::Xor => "stablehlo.xor",
        }
    }

    /// Whether `--auto-cast all` may run it in bf16/fp16 (not `pow`, `rem`, bitwise ops).
    pub fn half_precision_safe(self) -> bool {
        match self {
            BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Max
            | BinaryOp::Min => true,
            BinaryOp::Rem | BinaryOp::Pow | BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => false,
        }
    }

    /// The dtypes the op takes.
    pub fn dtypes(self) -> DTypeClass {
        match self {
            BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Rem
            | BinaryOp::Pow
            | BinaryOp::Max
            | BinaryOp::Min => DTypeClass::Numeric,
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => DTypeClass::Bits,
        }
    }
}

op_enum! {
/// Elementwise comparisons (result pred).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CompareOp {
    /// `x == y` (false when either is NaN).
    Eq,
    /// `x != y` (true when either is NaN).
    Ne,
    /// `x < y`.
    Lt,
    /// `x <= y`.
    Le,
    /// `x > y`.
    Gt,
    /// `x >= y`.
    Ge,
}
}

impl CompareOp {
    /// A short lowercase name for messages.
    pub fn name(self) -> &'static str {
        match self {
            CompareOp::Eq => "eq",
            CompareOp::Ne => "ne",
            CompareOp::Lt => "lt",
            CompareOp::Le => "le",
            CompareOp::Gt => "gt",
            CompareOp::Ge => "ge",
        }
    }

    /// The `comparison_direction` of `stablehlo.compare`.
    pub fn direction(self) -> &'static str {
        match self {
            CompareOp::Eq => "EQ",
            CompareOp::Ne => "NE",
            CompareOp::Lt => "LT",
            CompareOp::Le => "LE",
            CompareOp::Gt => "GT",
            CompareOp::Ge => "GE",
        }
    }

    /// The `compare_type` StableHLO needs for operands of `dtype`.
    pub fn compare_type(dtype: DType) -> &'static str {
        if dtype.is_float() {
            "FLOAT"
        } else if dtype.is_signed_int() {
            "SIGNED"
        } else {
            "UNSIGNED"
        }
    }

    /// The dtypes the op takes.
    pub fn dtypes(self) -> DTypeClass {
        DTypeClass::Any
    }
}

op_enum! {
/// Reductions (also the combiner of the collectives).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceOp {
    /// Sum; starts from 0.
    Sum,
    /// Maximum; starts from `-inf` (an integer dtype's minimum).
    Max,
    /// Minimum; starts from `+inf` (an integer dtype's maximum).
    Min,
    /// Product; starts from 1.
    Prod,
}
}

impl ReduceOp {
    /// A short lowercase name for messages.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "reduce_sum",
            ReduceOp::Max => "reduce_max",
            ReduceOp::Min => "reduce_min",
            ReduceOp::Prod => "reduce_prod",
        }
    }

    /// The binary op that combines two partial results.
    pub fn combiner(self) -> BinaryOp {
        match self {
            ReduceOp::Sum => BinaryOp::Add,
            ReduceOp::Max => BinaryOp::Max,
            ReduceOp::Min => BinaryOp::Min,
            ReduceOp::Prod => BinaryOp::Mul,
        }
    }

    /// The dtypes the op takes.
    pub fn dtypes(self) -> DTypeClass {
        DTypeClass::Numeric
    }
}
