//! `#[derive(Module)]` for neuron-pc: a model declared once, its parameters found by walking its
//! fields and named by their paths, as PyTorch's `named_parameters()` names them.
//!
//! | field | names |
//! | --- | --- |
//! | `weight: Tensor` | `weight` |
//! | `proj: Linear` (any `Module`) | `proj.weight`, `proj.bias` |
//! | `bias: Option<Tensor>`, `norm: Option<LayerNorm>` | as without `Option`, when `Some` |
//! | `layers: Vec<Layer>` (or `[Layer; N]`) | `layers.0.…`, `layers.1.…` |
//!
//! Field attributes, `#[module(...)]`:
//! - `rename = "self_attn"`: the name a checkpoint uses instead of the field's;
//! - `skip`: not a parameter (sizes, `eps`, a config);
//! - `buffer`: tensors reported by `named_buffers` (state a checkpoint holds that no optimizer
//!   updates, as `BatchNorm`'s running statistics), not by `named_params`;
//! - `index_step = 2`: a list numbered 0, 2, 4, ... as a PyTorch `nn.Sequential` that has an
//!   activation between its layers.
//!
//! Every other field must be a `Tensor` or implement `Module`; the compiler says which does not.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as Tokens};
use quote::{format_ident, quote};
use syn::spanned::Spanned;
use syn::{
    parse_macro_input, Data, DeriveInput, Fields, GenericArgument, LitInt, LitStr, PathArguments,
    Type,
};

/// Implements `neuron_pc::nn::Module` (`named_params` and `named_buffers`) from the fields.
#[proc_macro_derive(Module, attributes(module))]
pub fn derive_module(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

#[derive(Default)]
struct FieldAttrs {
    skip: bool,
    buffer: bool,
    rename: Option<String>,
    index_step: Option<usize>,
}

fn field_attrs(attrs: &[syn::Attribute]) -> syn::Result<FieldAttrs> {
    let mut a = FieldAttrs::default();
    for attr in attrs.iter().filter(|a| a.path().is_ident("module")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("skip") {
                a.skip = true;
            } else if meta.path.is_ident("buffer") {
                a.buffer = true;
            } else if meta.path.is_ident("rename") {
                let name: LitStr = meta.value()?.parse()?;
                if name.value().is_empty() || name.value().contains('.') {
                    return Err(syn::Error::new(
                        name.span(),
                        "a rename is one non-empty name without dots",
                    ));
                }
                a.rename = Some(name.value());
            } else if meta.path.is_ident("index_step") {
                let step: LitInt = meta.value()?.parse()?;
                let n: usize = step.base10_parse()?;
                if n == 0 {
                    return Err(syn::Error::new(step.span(), "index_step is at least 1"));
                }
                a.index_step = Some(n);
            } else {
                return Err(meta.error(
                    "unknown module attribute: expected skip, buffer, rename = \"...\" or \
                     index_step = N",
                ));
            }
            Ok(())
        })?;
    }
    if a.skip && (a.buffer || a.rename.is_some() || a.index_step.is_some()) {
        return Err(syn::Error::new(
            Span::call_site(),
            "a skipped field takes no other module attribute",
        ));
    }
    Ok(a)
}

/// `T` of `Name<T>` when `ty`'s last path segment is `name`.
fn generic_arg<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    if last.ident != name {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.first()? {
        GenericArgument::Type(t) if args.args.len() == 1 => Some(t),
        _ => None,
    }
}

fn is_tensor(ty: &Type) -> bool {
    matches!(ty, Type::Path(p) if p.qself.is_none()
        && p.path.segments.last().is_some_and(|s| s.ident == "Tensor" && s.arguments.is_empty()))
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Params,
    Buffers,
}

/// Statements visiting `value` (an expression of type `&ty`) named `name` (an expression that
/// derefs to `&str`).
fn visit(
    ty: &Type,
    value: Tokens,
    name: Tokens,
    attrs: &FieldAttrs,
    kind: Kind,
    depth: usize,
) -> Tokens {
    let krate = quote!(::neuron_pc);
    if let Some(inner) = generic_arg(ty, "Option") {
        let v = format_ident!("v{depth}");
        let body = visit(inner, quote!(#v), name, attrs, kind, depth + 1);
        return quote! {
            if let ::core::option::Option::Some(#v) = #value {
                #body
            }
        };
    }
    let element = match ty {
        Type::Array(a) => Some(&*a.elem),
        _ => generic_arg(ty, "Vec"),
    };
    if let Some(inner) = element {
        let (i, v) = (format_ident!("i{depth}"), format_ident!("v{depth}"));
        // only the outermost list takes the step
        let step = if depth == 0 {
            attrs.index_step.unwrap_or(1)
        } else {
            1
        };
        let item = quote!(&#krate::nn::join_name(#name, &(#i * #step).to_string()));
        let body = visit(inner, quote!(#v), item, attrs, kind, depth + 1);
        return quote! {
            for (#i, #v) in (#value).iter().enumerate() {
                #body
            }
        };
    }
    if is_tensor(ty) {
        let wanted = if attrs.buffer {
            Kind::Buffers
        } else {
            Kind::Params
        };
        if kind != wanted {
            return Tokens::new();
        }
        return quote! {
            out.push((
                ::std::string::ToString::to_string(#name),
                ::core::clone::Clone::clone(#value),
            ));
        };
    }
    let method = match kind {
        Kind::Params => quote!(named_params),
        Kind::Buffers => quote!(named_buffers),
    };
    quote! { #krate::nn::Module::#method(#value, #name, out); }
}

fn expand(input: &DeriveInput) -> syn::Result<Tokens> {
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new(
            input.span(),
            "#[derive(Module)] takes a struct: its fields are the parameters",
        ));
    };
    let mut params = Vec::new();
    let mut buffers = Vec::new();
    let fields: Vec<(String, Tokens, &syn::Field)> = match &data.fields {
        Fields::Named(f) => f
            .named
            .iter()
            .map(|f| {
                let ident = f.ident.as_ref().expect("named fields have names");
                let name = ident.to_string();
                let name = name.strip_prefix("r#").unwrap_or(&name).to_string();
                (name, quote!(#ident), f)
            })
            .collect(),
        Fields::Unnamed(f) => f
            .unnamed
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let index = syn::Index::from(i);
                (i.to_string(), quote!(#index), f)
            })
            .collect(),
        Fields::Unit => Vec::new(),
    };
    for (name, member, field) in fields {
        let attrs = field_attrs(&field.attrs)?;
        if attrs.skip {
            continue;
        }
        let name = attrs.rename.clone().unwrap_or(name);
        let full = quote!(&::neuron_pc::nn::join_name(prefix, #name));
        let value = quote!(&self.#member);
        params.push(visit(
            &field.ty,
            value.clone(),
            full.clone(),
            &attrs,
            Kind::Params,
            0,
        ));
        buffers.push(visit(&field.ty, value, full, &attrs, Kind::Buffers, 0));
    }
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    Ok(quote! {
        impl #impl_generics ::neuron_pc::nn::Module for #ident #ty_generics #where_clause {
            #[allow(unused_variables)]
            fn named_params(
                &self,
                prefix: &str,
                out: &mut ::std::vec::Vec<(::std::string::String, ::neuron_pc::Tensor)>,
            ) {
                #(#params)*
            }

            #[allow(unused_variables)]
            fn named_buffers(
                &self,
                prefix: &str,
                out: &mut ::std::vec::Vec<(::std::string::String, ::neuron_pc::Tensor)>,
            ) {
                #(#buffers)*
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(input: DeriveInput) -> String {
        match expand(&input) {
            Ok(tokens) => panic!("expected an error, got {tokens}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn bad_declarations_are_one_clear_error() {
        for (input, want) in [
            (syn::parse_quote! { enum E { A, B } }, "takes a struct"),
            (
                syn::parse_quote! { struct S { #[module(weird)] w: Tensor } },
                "unknown module attribute",
            ),
            (
                syn::parse_quote! { struct S { #[module(index_step = 0)] l: Vec<Linear> } },
                "at least 1",
            ),
            (
                syn::parse_quote! { struct S { #[module(rename = "a.b")] l: Linear } },
                "without dots",
            ),
            (
                syn::parse_quote! { struct S { #[module(skip, rename = "x")] n: usize } },
                "no other module attribute",
            ),
        ] {
            let e = error(input);
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn fields_expand_by_type() {
        let input: DeriveInput = syn::parse_quote! {
            struct S {
                #[module(rename = "self_attn")]
                attn: Attention,
                bias: Option<Tensor>,
                #[module(index_step = 2)]
                mlp: Vec<Linear>,
                #[module(skip)]
                eps: f64,
            }
        };
        let code = expand(&input).unwrap().to_string();
        assert!(code.contains("\"self_attn\""), "{code}");
        assert!(!code.contains("\"attn\""), "{code}");
        assert!(!code.contains("eps"), "{code}");
        assert!(code.contains("i0 * 2usize"), "{code}");
        assert!(
            code.contains(":: core :: option :: Option :: Some"),
            "{code}"
        );
    }
}
