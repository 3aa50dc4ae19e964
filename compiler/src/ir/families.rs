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

op_enum! {
/// Elementwise one-operand ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnaryOp {
    /// `-x` (integers wrap).
    Neg,
    /// `|x|` (integers wrap: `abs(MIN)` is `MIN`).
    Abs,
    /// -1, 0 or 1 by the sign of `x`; a float zero keeps its sign and NaN stays NaN.
    Sign,
    /// `e^x`.
    Exp,
    /// Natural logarithm.
    Log,
    /// `log(1 + x)`, accurate for small x (PyTorch's `log1p`).
    Log1p,
    /// Hyperbolic tangent.
    Tanh,
    /// The sigmoid `1 / (1 + e^-x)` (PyTorch's `sigmoid`).
    Logistic,
    /// Square root.
    Sqrt,
    /// `1 / sqrt(x)`.
    Rsqrt,
    /// Sine, in radians.
    Sin,
    /// Cosine, in radians.
    Cos,
    /// The Gauss error function (CHLO's `chlo.erf`).
    Erf,
    /// `1 - erf(x)`, without the cancellation for large x.
    Erfc,
    /// Rounds down to an integral value (the dtype stays a float).
    Floor,
    /// Rounds up to an integral value (the dtype stays a float).
    Ceil,
    /// Logical not on pred, bitwise not on integers.
    Not,
}
}

impl UnaryOp {
    /// A short lowercase name for messages.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Sign => "sign",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Log1p => "log1p",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Logistic => "logistic",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Erf => "erf",
            UnaryOp::Erfc => "erfc",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Not => "not",
        }
    }

    /// The op as spelled in MLIR text (`erf` comes from the CHLO dialect).
    pub fn stablehlo_name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "stablehlo.negate",
            UnaryOp::Abs => "stablehlo.abs",
            UnaryOp::Sign => "stablehlo.sign",
            UnaryOp::Exp => "stablehlo.exponential",
            UnaryOp::Log => "stablehlo.log",
            UnaryOp::Log1p => "stablehlo.log_plus_one",
            UnaryOp::Tanh => "stablehlo.tanh",
            UnaryOp::Logistic => "stablehlo.logistic",
            UnaryOp::Sqrt => "stablehlo.sqrt",
            UnaryOp::Rsqrt => "stablehlo.rsqrt",
            UnaryOp::Sin => "stablehlo.sine",
            UnaryOp::Cos => "stablehlo.cosine",
            UnaryOp::Erf => "chlo.erf",
            UnaryOp::Erfc => "chlo.erfc",
            UnaryOp::Floor => "stablehlo.floor",
            UnaryOp::Ceil => "stablehlo.ceil",
            UnaryOp::Not => "stablehlo.not",
        }
    }

    /// Whether `--auto-cast all` may run it in bf16/fp16: bounded or sign-like results
    /// (`tanh`, `erf`, ...), not the range-hungry ones (`exp`, `log`, `sqrt`, `rsqrt`).
    pub fn half_precision_safe(self) -> bool {
        match self {
            UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Sign
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::Tanh
            | UnaryOp::Logistic
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Erf
            | UnaryOp::Erfc => true,
            UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Log1p
            | UnaryOp::Sqrt
            | UnaryOp::Rsqrt
            | UnaryOp::Not => false,
        }
    }

    /// The dtypes the op takes (the result has the operand's dtype).
    pub fn dtypes(self) -> DTypeClass {
        match self {
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign => DTypeClass::Signed,
            UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Log1p
            | UnaryOp::Tanh
            | UnaryOp::Logistic
            | UnaryOp::Sqrt
            | UnaryOp::Rsqrt
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Erf
            | UnaryOp::Erfc
            | UnaryOp::Floor
            | UnaryOp::Ceil => DTypeClass::Float,
            UnaryOp::Not => DTypeClass::Bits,
        }
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
