//! What a loaded executable itself says it takes and returns, checked against the program it
//! is supposed to be.
//!
//! A cache entry is verified by digest, but a digest only proves the bytes are the ones the
//! record names. An executable of another program (planted, or written under the wrong key)
//! would otherwise be launched with this program's arguments and fail deep in the plugin, or
//! worse, run. The result types come from `PJRT_Executable_OutputElementTypes` and
//! `PJRT_Executable_OutputDimensions`; the C API has no call for parameters, so their types
//! are read from the entry computation's shape in `PJRT_Executable_OptimizedProgram` (an
//! `HloModuleProto`) when the plugin provides it. That call serializes the whole optimized
//! module again; an executable loaded from bytes has the same module in them, so where the
//! bytes are in the CPU plugin's layout the types are read there instead, and a mismatch is
//! confirmed with the plugin before the executable is refused ([`parameter_types_in`]).

use super::buffer::from_pjrt_type;
use super::executable::LoadedExecutable;
use super::signature::{ArgType, Signature};
use super::sys::{self, Args};
use crate::dtype::DType;
use crate::error::{Error, Result};

impl LoadedExecutable {
    /// The types of the results, as the executable reports them.
    pub fn output_types(&self) -> Result<Vec<ArgType>> {
        let view = self.executable()?;
        let plugin = self.client().plugin_ref();
        let mut types = sys::PJRT_Executable_OutputElementTypes_Args {
            executable: view.raw,
            ..Args::new()
        };
        pjrt_call!(plugin, PJRT_Executable_OutputElementTypes, &mut types)?;
        let mut dims = sys::PJRT_Executable_OutputDimensions_Args {
            executable: view.raw,
            ..Args::new()
        };
        pjrt_call!(plugin, PJRT_Executable_OutputDimensions, &mut dims)?;
        let n = types.num_output_types;
        if dims.num_outputs != n
            || (n > 0 && (types.output_types.is_null() || dims.dim_sizes.is_null()))
        {
            return Err(mismatch(format!(
                "the plugin reports {n} output types but {} output shapes",
                dims.num_outputs
            )));
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: the plugin returned `n` element types and `n` rank counts that stay valid
        // while the executable lives (it owns them); `view` keeps it alive here.
        let (elem, ranks) = unsafe {
            (
                std::slice::from_raw_parts(types.output_types, n),
                std::slice::from_raw_parts(dims.dim_sizes, n),
            )
        };
        let total: usize = ranks.iter().sum();
        if total > 0 && dims.dims.is_null() {
            return Err(mismatch("the plugin reports no output dimensions".into()));
        }
        let flat = if total == 0 {
            &[][..]
        } else {
            // SAFETY: as above; `dims` holds the concatenation of every output's dimensions
            // (`total` of them, checked non-null).
            unsafe { std::slice::from_raw_parts(dims.dims, total) }
        };
        let mut out = Vec::with_capacity(n);
        let mut at = 0;
        for (&t, &rank) in elem.iter().zip(ranks) {
            let dtype = from_pjrt_type(t).ok_or_else(|| {
                mismatch(format!(
                    "an output of element type {t} this crate does not know"
                ))
            })?;
            let d = flat[at..at + rank]
                .iter()
                .map(|&v| {
                    usize::try_from(v)
                        .map_err(|_| mismatch(format!("a dynamic output dimension ({v})")))
                })
                .collect::<Result<Vec<_>>>()?;
            at += rank;
            out.push(ArgType { dtype, dims: d });
        }
        Ok(out)
    }

    /// The parameter types, read from the optimized program; `None` when the plugin does not
    /// provide it in a form this crate reads.
    pub fn parameter_types(&self) -> Option<Vec<ArgType>> {
        let code = self.optimized_module()?;
        let module = module_of(&code)?;
        // HloModuleProto.host_program_shape = 4; ProgramShapeProto.parameters = 1.
        let shape = proto::field(module, 4)?;
        proto::fields(shape, 1).map(proto::array_shape).collect()
    }

    /// The opcodes of the optimized program's entry computation, in its order (`fusion`, `dot`,
    /// `copy`, ...; the instructions inside fusions are not listed): what XLA made of the
    /// program, as in its `cpu_after_optimizations` dump. `None` when the plugin does not
    /// provide the program in a form this crate reads.
    pub fn optimized_entry_opcodes(&self) -> Option<Vec<String>> {
        let code = self.optimized_module()?;
        let module = module_of(&code)?;
        // HloModuleProto: entry_computation_name = 2, computations = 3;
        // HloComputationProto: name = 1, instructions = 2; HloInstructionProto: opcode = 2.
        let entry = proto::field(module, 2)?;
        let computation = proto::fields(module, 3).find(|c| proto::field(c, 1) == Some(entry))?;
        proto::fields(computation, 2)
            .map(|i| Some(String::from_utf8_lossy(proto::field(i, 2)?).into_owned()))
            .collect()
    }

    /// The bytes of `PJRT_Executable_OptimizedProgram` and their format.
    fn optimized_module(&self) -> Option<(Vec<u8>, String)> {
        let view = self.executable().ok()?;
        let plugin = self.client().plugin_ref();
        let mut program = sys::PJRT_Program { ..Args::new() };
        let mut args = sys::PJRT_Executable_OptimizedProgram_Args {
            executable: view.raw,
            program: &mut program,
            ..Args::new()
        };
        pjrt_call!(plugin, PJRT_Executable_OptimizedProgram, &mut args).ok()?;
        let mut code = vec![0u8; program.code_size];
        program.code = code.as_mut_ptr().cast();
        let mut args = sys::PJRT_Executable_OptimizedProgram_Args {
            executable: view.raw,
            program: &mut program,
            ..Args::new()
        };
        pjrt_call!(plugin, PJRT_Executable_OptimizedProgram, &mut args).ok()?;
        let format = if program.format.is_null() {
            String::new()
        } else {
            // SAFETY: the plugin set `format`/`format_size` to a string it owns.
            String::from_utf8_lossy(unsafe {
                std::slice::from_raw_parts(program.format.cast::<u8>(), program.format_size)
            })
            .into_owned()
        };
        code.truncate(program.code_size);
        Some((code, format))
    }

    /// Gives an executable deserialized without a signature the signature of the program it
    /// is meant to be, after checking that it takes and returns what the signature says (as
    /// [`Client::deserialize`] does when given one). `interface` is this executable's
    /// [`LoadedExecutable::interface`], asked ahead (`None`: asked here).
    ///
    /// [`Client::deserialize`]: super::Client::deserialize
    pub fn checked_against(
        mut self,
        interface: Option<&Interface>,
        signature: Signature,
    ) -> Result<LoadedExecutable> {
        match interface {
            Some(i) => self.check_asked(i, &signature)?,
            None => self.check_interface(&signature)?,
        }
        self.set_signature(signature);
        Ok(self)
    }

    /// What this executable says it takes and returns.
    pub fn interface(&self) -> Result<Interface> {
        Ok(Interface {
            results: self.output_types()?,
            params: self.parameter_types(),
        })
    }

    /// [`LoadedExecutable::interface`] for an executable loaded from `serialized`: the
    /// parameter types are read from those bytes where they are in the CPU plugin's layout
    /// ([`parameter_types_in`]), which spares asking the plugin to serialize its optimized
    /// program again (12 ms of the small Llama's first step, on its critical path).
    pub fn interface_from(&self, serialized: &[u8]) -> Result<Interface> {
        Ok(Interface {
            results: self.output_types()?,
            params: parameter_types_in(serialized).or_else(|| self.parameter_types()),
        })
    }

    /// Checks `interface` (this executable's, asked ahead) against `expected`; on a mismatch
    /// the plugin is asked again before the executable is refused. Parameter types read from
    /// the serialized bytes rest on a layout that is the plugin's own business: a misread must
    /// cost a slower check, never a good executable.
    pub fn check_asked(&self, interface: &Interface, expected: &Signature) -> Result<()> {
        interface
            .check(expected)
            .or_else(|_| self.check_interface(expected))
    }

    /// Checks that this executable takes and returns what `expected` (read from the program
    /// text it is meant to be) says: result count, dtypes and shapes, and parameter count,
    /// dtypes and shapes where the plugin exposes them.
    pub fn check_interface(&self, expected: &Signature) -> Result<()> {
        self.interface()?.check(expected)
    }
}

/// The parameter types recorded in the serialized form of an executable of the CPU plugin:
/// an `ExecutableAndOptionsProto` whose executable (field 1) is a `CompilationResultProto`
/// holding the `HloModuleProtoWithConfig` (field 1) of the module the executable is rebuilt
/// from (its field 1), whose `host_program_shape` (4) lists the parameters (1). `None` where
/// the bytes are laid out otherwise (another plugin or version): the caller asks the plugin.
pub fn parameter_types_in(serialized: &[u8]) -> Option<Vec<ArgType>> {
    let executable = proto::field(serialized, 1)?;
    let module = proto::field(proto::field(executable, 1)?, 1)?;
    let shape = proto::field(module, 4)?;
    proto::fields(shape, 1).map(proto::array_shape).collect()
}

/// The result types of an executable and, where the plugin exposes them, its parameter types
/// (asking the plugin costs a serialization of the optimized program, so a caller that loads
/// an executable before it knows the program can ask ahead and check later).
#[derive(Clone, Debug, PartialEq)]
pub struct Interface {
    /// The result types, as the executable reports them.
    pub results: Vec<ArgType>,
    /// The parameter types; `None` when the plugin does not expose them in a form this crate
    /// reads (then [`Interface::check`] compares results only).
    pub params: Option<Vec<ArgType>>,
}

impl Interface {
    /// Checks this interface against the signature of the program the executable is meant to
    /// be (see [`LoadedExecutable::check_interface`]).
    pub fn check(&self, expected: &Signature) -> Result<()> {
        if self.results != expected.results {
            return Err(mismatch(format!(
                "the executable returns {} but the program returns {}",
                list(&self.results),
                list(&expected.results)
            )));
        }
        if let Some(params) = &self.params {
            if *params != expected.params {
                return Err(mismatch(format!(
                    "the executable takes {} but the program takes {}",
                    list(params),
                    list(&expected.params)
                )));
            }
        }
        Ok(())
    }
}

fn mismatch(message: String) -> Error {
    Error::Interface { message }
}

fn list(types: &[ArgType]) -> String {
    let items: Vec<String> = types.iter().map(ToString::to_string).collect();
    format!("{} values ({})", types.len(), items.join(", "))
}

/// The `HloModuleProto` in the bytes of an optimized program of `format`.
fn module_of((code, format): &(Vec<u8>, String)) -> Option<&[u8]> {
    match format.as_str() {
        "hlo" => Some(&code[..]),
        // HloModuleProtoWithConfig { hlo_module = 1, config = 2 }
        "hlo_with_config" => proto::field(code, 1),
        _ => None,
    }
}

/// Just enough protobuf wire format to walk to a few nested fields.
mod proto {
    use super::{ArgType, DType};

    fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *b.get(*at)?;
            *at += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    /// `(field number, wire type, payload)` for each field of a message: for varints the
    /// payload is empty and the value is returned separately.
    fn walk(b: &[u8]) -> impl Iterator<Item = (u64, &[u8], u64)> + '_ {
        let mut at = 0;
        std::iter::from_fn(move || {
            if at >= b.len() {
                return None;
            }
            let tag = varint(b, &mut at)?;
            match tag & 7 {
                0 => {
                    let v = varint(b, &mut at)?;
                    Some((tag >> 3, &b[0..0], v))
                }
                1 => {
                    at += 8;
                    (at <= b.len()).then(|| (tag >> 3, &b[0..0], 0))
                }
                2 => {
                    let len = usize::try_from(varint(b, &mut at)?).ok()?;
                    let end = at.checked_add(len).filter(|e| *e <= b.len())?;
                    let payload = &b[at..end];
                    at = end;
                    Some((tag >> 3, payload, len as u64))
                }
                5 => {
                    at += 4;
                    (at <= b.len()).then(|| (tag >> 3, &b[0..0], 0))
                }
                _ => None,
            }
        })
    }

    /// The first length-delimited field `n`.
    pub(super) fn field(b: &[u8], n: u64) -> Option<&[u8]> {
        walk(b).find(|(f, _, _)| *f == n).map(|(_, p, _)| p)
    }

    /// Every length-delimited field `n`.
    pub(super) fn fields(b: &[u8], n: u64) -> impl Iterator<Item = &[u8]> {
        walk(b).filter(move |(f, _, _)| *f == n).map(|(_, p, _)| p)
    }

    /// A `ShapeProto` of an array (element_type = 2, dimensions = 3, packed or not).
    pub(super) fn array_shape(b: &[u8]) -> Option<ArgType> {
        let mut elem = None;
        let mut dims = Vec::new();
        let mut at = 0;
        while at < b.len() {
            let tag = varint(b, &mut at)?;
            match (tag >> 3, tag & 7) {
                (2, 0) => elem = Some(varint(b, &mut at)?),
                (3, 0) => dims.push(usize::try_from(varint(b, &mut at)?).ok()?),
                (3, 2) => {
                    let len = usize::try_from(varint(b, &mut at)?).ok()?;
                    let end = at.checked_add(len).filter(|e| *e <= b.len())?;
                    let mut p = at;
                    while p < end {
                        dims.push(usize::try_from(varint(b, &mut p)?).ok()?);
                    }
                    at = end;
                }
                // A tuple parameter is not something this crate's programs take.
                (4, _) => return None,
                (_, 0) => {
                    varint(b, &mut at)?;
                }
                (_, 2) => {
                    let len = usize::try_from(varint(b, &mut at)?).ok()?;
                    at = at.checked_add(len).filter(|e| *e <= b.len())?;
                }
                (_, 1) => at += 8,
                (_, 5) => at += 4,
                _ => return None,
            }
        }
        // xla::PrimitiveType numbers.
        let dtype = match elem? {
            1 => DType::Pred,
            4 => DType::I32,
            5 => DType::I64,
            6 => DType::U8,
            8 => DType::U32,
            10 => DType::F16,
            11 => DType::F32,
            12 => DType::F64,
            16 => DType::BF16,
            _ => return None,
        };
        Some(ArgType { dtype, dims })
    }
}
