//! The parameter and result types of a program's `@main`, read from its StableHLO text.
//!
//! The CPU plugin does not check argument dtypes when the byte sizes agree (an `i32[2]` buffer
//! is accepted for an `f32[2]` parameter), so executables check arguments against this before
//! every launch. A signature that cannot be read (dynamic dimensions, unknown element types)
//! leaves checking to the plugin.

use crate::dtype::DType;

/// The type of one argument or result.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ArgType {
    /// The element type.
    pub dtype: DType,
    /// The shape (empty for a scalar).
    pub dims: Vec<usize>,
}

impl std::fmt::Display for ArgType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{:?}", self.dtype, self.dims)
    }
}

/// Parameter and result types of `@main`.
#[derive(Clone, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Signature {
    /// The parameter types, in order.
    pub params: Vec<ArgType>,
    /// The result types, in order.
    pub results: Vec<ArgType>,
}

impl Signature {
    /// Reads the signature of `func.func [public] @main(...) -> ...` from MLIR text.
    pub fn parse(mlir: &str) -> Option<Signature> {
        let start = mlir.find("@main(")? + "@main(".len();
        let (params_text, rest) = split_balanced(&mlir[start..])?;
        let params = tensor_types(params_text)?;
        let rest = rest.trim_start();
        let results = if let Some(r) = rest.strip_prefix("->") {
            let r = r.trim_start();
            if let Some(inner) = r.strip_prefix('(') {
                tensor_types(split_balanced(inner)?.0)?
            } else {
                let end = r.find(['{', '\n']).unwrap_or(r.len());
                tensor_types(&r[..end])?
            }
        } else {
            Vec::new()
        };
        Some(Signature { params, results })
    }
}

/// Given text just after an opening parenthesis, returns (inside, after the closing one).
fn split_balanced(s: &str) -> Option<(&str, &str)> {
    let mut depth = 1usize;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '{' | '[' | '<' => depth += 1,
            ')' | '}' | ']' | '>' => {
                depth -= 1;
                if depth == 0 {
                    return (c == ')').then(|| (&s[..i], &s[i + 1..]));
                }
            }
            '"' => {} // strings in attributes hold no brackets we need to skip in practice
            _ => {}
        }
    }
    None
}

/// Every `tensor<...>` at the top level of `s` (attribute dictionaries are skipped).
fn tensor_types(s: &str) -> Option<Vec<ArgType>> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    let bytes = s.as_bytes();
    while i < bytes.len() {
        match bytes[i] {
            b'{' | b'(' | b'[' => depth += 1,
            b'}' | b')' | b']' => depth = depth.saturating_sub(1),
            b't' if depth == 0 && s[i..].starts_with("tensor<") => {
                let body_start = i + "tensor<".len();
                let end = body_start + s[body_start..].find('>')?;
                out.push(parse_tensor_body(&s[body_start..end])?);
                i = end;
            }
            _ => {}
        }
        i += 1;
    }
    Some(out)
}

/// `2x3xf32` or `f32` (no encoding, static dimensions only).
fn parse_tensor_body(body: &str) -> Option<ArgType> {
    let mut parts: Vec<&str> = body.split('x').collect();
    // Element types never contain 'x'; dimensions are numbers.
    let elem = parts.pop()?;
    let dtype = DType::from_name(elem.trim())?;
    let dims = parts
        .iter()
        .map(|d| d.trim().parse::<usize>().ok())
        .collect::<Option<Vec<_>>>()?;
    Some(ArgType { dtype, dims })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(dtype: DType, dims: &[usize]) -> ArgType {
        ArgType {
            dtype,
            dims: dims.to_vec(),
        }
    }

    #[test]
    fn plain_and_jax_style_signatures() {
        let s = Signature::parse(
            "func.func @main(%a: tensor<2x3xf32>, %b: tensor<i32>) -> tensor<2x3xf32> {",
        )
        .unwrap();
        assert_eq!(s.params, vec![t(DType::F32, &[2, 3]), t(DType::I32, &[])]);
        assert_eq!(s.results, vec![t(DType::F32, &[2, 3])]);

        // The signature on one line, as JAX prints it.
        let jax = concat!(
            "module @jit_f attributes {mhlo.num_partitions = 1 : i32} {\n",
            r#"  func.func public @main(%arg0: tensor<4xbf16> {mhlo.sharding = "{replicated}"}, "#,
            r#"%arg1: tensor<1x8xui8>) "#,
            r#"-> (tensor<4xbf16> {jax.result_info = "[0]"}, tensor<i1>) {"#,
        );
        let s = Signature::parse(jax).unwrap();
        assert_eq!(s.params, vec![t(DType::BF16, &[4]), t(DType::U8, &[1, 8])]);
        assert_eq!(s.results, vec![t(DType::BF16, &[4]), t(DType::Pred, &[])]);
    }

    #[test]
    fn unreadable_signatures_give_none() {
        assert_eq!(
            Signature::parse("func.func @other(%a: tensor<2xf32>)"),
            None
        );
        assert_eq!(
            Signature::parse("func.func @main(%a: tensor<?x2xf32>) -> tensor<2xf32>"),
            None
        );
        assert_eq!(
            Signature::parse("func.func @main(%a: tensor<2xcomplex<f32>>) -> tensor<2xf32>"),
            None
        );
    }
}
