//! Compiler flags in the syntax Neuron users already write in `NEURON_CC_FLAGS`
//! (`--target trn1 --auto-cast all --auto-cast-type bf16 --model-type transformer --optlevel O1`).
//!
//! Parsing is strict: a flag this crate does not implement is refused with the list of the
//! supported ones, never silently ignored, because an ignored `--auto-cast` or `--optlevel` would
//! hand users an executable other than the one they asked for.
//!
//! Two layers: [`FlagOverrides`] holds what one source (the environment, the command line) set
//! explicitly; [`CompilerFlags`] is the resolved set with every default filled in. Defaults are
//! filled only after all sources are overlaid, because one default depends on another flag: the
//! auto-cast default is `matmult` on Trainium targets (as in Neuron's own compiler) and `none` on
//! cpu and cuda, where users expect float32 results unless they ask for casting.

mod neuron;
mod parse;
mod words;

use std::fmt;

use crate::error::{Error, Result};
pub use crate::pjrt::Target;

pub use neuron::NeuronFlags;
pub use words::split_words;

/// The environment variable read by [`CompilerFlags::from_env`].
pub const NEURON_CC_FLAGS: &str = "NEURON_CC_FLAGS";

/// Defines a flag value enum with its spellings, its canonical name and its one-line list of
/// supported values, so parser, printer and messages cannot drift apart.
macro_rules! flag_enum {
    (
        $(#[$m:meta])* $name:ident {
            $($(#[$vm:meta])* $var:ident => $canon:literal $(| $alias:literal)*),+ $(,)?
        }
    ) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($(#[$vm])* $var),+ }

        impl $name {
            /// Every value, in the order the help text lists them.
            pub const ALL: &'static [$name] = &[$($name::$var),+];

            /// The spelling used in messages, cache keys and arguments handed to Neuron.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$var => $canon),+ }
            }

            /// Parses the canonical spelling or an accepted alias (case-insensitive).
            pub fn from_name(s: &str) -> Option<$name> {
                let s = s.to_ascii_lowercase();
                match s.as_str() {
                    $($canon $(| $alias)* => Some($name::$var),)+
                    _ => None,
                }
            }

            /// The supported values as one comma-separated list, for error messages.
            pub fn supported() -> String {
                $name::ALL.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(", ")
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

flag_enum! {
    /// Which operations auto-cast lowers to the reduced precision of [`AutoCastType`].
    AutoCast {
        /// No casting: every op runs in the dtype the graph gives it.
        None => "none",
        /// Matrix multiplications (`dot_general`) take reduced-precision inputs; their results
        /// stay float32.
        Matmult => "matmult",
        /// Matmuls plus elementwise float ops; reductions and numerically sensitive ops stay
        /// float32 (see the auto-cast pass).
        All => "all",
    }
}

flag_enum! {
    /// The reduced precision auto-cast uses. Neuron also knows `tf32` and `fp8_e4m3`; XLA's CPU
    /// and GPU backends have no matching storage type, so they are refused rather than faked.
    AutoCastType {
        /// bfloat16 (the default).
        Bf16 => "bf16",
        /// IEEE float16; `f16` is accepted as an alias.
        Fp16 => "fp16" | "f16",
    }
}

flag_enum! {
    /// Neuron's model-type hint. It is handed to the Neuron compiler on Trainium targets; the
    /// graph passes treat both values alike today, but it still enters the cache key because it
    /// changes the Neuron executable.
    ModelType {
        /// No particular model family (the default).
        Generic => "generic",
        /// A transformer model.
        Transformer => "transformer",
    }
}

/// Optimization level: how much compile time to spend for a faster step. What each level runs
/// is defined in one table, [`crate::optlevel::plan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum OptLevel {
    /// Fast compile: fewer graph passes and a cheaper backend configuration.
    O1,
    /// The default balance.
    #[default]
    O2,
    /// Everything that may make the step faster, whatever the compile time.
    O3,
}

impl OptLevel {
    /// Every level, lowest first.
    pub const ALL: &'static [OptLevel] = &[OptLevel::O1, OptLevel::O2, OptLevel::O3];

    /// The level as a digit, the form Neuron's `--optlevel` takes.
    pub fn number(self) -> u8 {
        match self {
            OptLevel::O1 => 1,
            OptLevel::O2 => 2,
            OptLevel::O3 => 3,
        }
    }

    /// Parses `O1`/`o1`/`1` (and the same for 2 and 3).
    pub fn from_name(s: &str) -> Option<OptLevel> {
        let digits = s.strip_prefix(['O', 'o']).unwrap_or(s);
        match digits {
            "1" => Some(OptLevel::O1),
            "2" => Some(OptLevel::O2),
            "3" => Some(OptLevel::O3),
            _ => None,
        }
    }
}

impl fmt::Display for OptLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "O{}", self.number())
    }
}

/// True for the targets whose compiler is Neuron's (`neuronx-cc`), which receives
/// [`CompilerFlags::to_neuron_args`].
pub fn is_neuron(target: Target) -> bool {
    matches!(target, Target::Trn1 | Target::Trn2)
}

/// The auto-cast used when none is given: Neuron compiles matmuls in bf16 by default on
/// Trainium; on cpu and cuda the default keeps the graph's own dtypes.
pub fn default_auto_cast(target: Target) -> AutoCast {
    if is_neuron(target) {
        AutoCast::Matmult
    } else {
        AutoCast::None
    }
}

/// The supported targets as one comma-separated list, for error messages.
pub(crate) fn supported_targets() -> String {
    Target::ALL
        .iter()
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What one source of flags set explicitly; `None` means "not given here". Overlay sources with
/// [`FlagOverrides::overlay`], then [`FlagOverrides::resolve`] to fill in defaults. The fields
/// are public so a command-line parser (clap) can build one directly.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlagOverrides {
    /// `--target`.
    pub target: Option<Target>,
    /// `--optlevel` (or `-O`).
    pub opt_level: Option<OptLevel>,
    /// `--auto-cast`.
    pub auto_cast: Option<AutoCast>,
    /// `--auto-cast-type`.
    pub auto_cast_type: Option<AutoCastType>,
    /// `--model-type`.
    pub model_type: Option<ModelType>,
    /// `--retry_failed_compilation` (torch-neuronx's flag): `Some(true)` when given alone,
    /// or the value of `--retry_failed_compilation=true|false`.
    pub retry_failed: Option<bool>,
    /// `--cache_dir` (torch-neuronx's flag): a path or URL.
    pub cache_dir: Option<String>,
    /// `neuronx-cc` flags passed through to Neuron's compiler (see [`NeuronFlags`]).
    pub neuron: NeuronFlags,
}

impl FlagOverrides {
    /// Parses a flag string in Neuron syntax (shell-style quoting allowed, later repeats win).
    pub fn parse(flags: &str) -> Result<FlagOverrides> {
        parse::parse_str(flags, "compiler flags")
    }

    /// Parses already-split arguments (for example the rest of a command line).
    pub fn parse_args<S: AsRef<str>>(args: &[S]) -> Result<FlagOverrides> {
        parse::parse_words(args, "command line")
    }

    /// Reads `NEURON_CC_FLAGS`; unset or blank gives no overrides.
    pub fn from_env() -> Result<FlagOverrides> {
        match std::env::var(NEURON_CC_FLAGS) {
            Ok(v) => parse::parse_str(&v, NEURON_CC_FLAGS),
            Err(std::env::VarError::NotPresent) => Ok(FlagOverrides::default()),
            Err(std::env::VarError::NotUnicode(_)) => Err(Error::Flag {
                message: format!("{NEURON_CC_FLAGS} is not valid UTF-8"),
            }),
        }
    }

    /// `self` with every field that `over` sets replaced by `over`'s value (`over` wins).
    pub fn overlay(&self, over: &FlagOverrides) -> FlagOverrides {
        FlagOverrides {
            target: over.target.or(self.target),
            opt_level: over.opt_level.or(self.opt_level),
            auto_cast: over.auto_cast.or(self.auto_cast),
            auto_cast_type: over.auto_cast_type.or(self.auto_cast_type),
            model_type: over.model_type.or(self.model_type),
            retry_failed: over.retry_failed.or(self.retry_failed),
            cache_dir: over.cache_dir.clone().or_else(|| self.cache_dir.clone()),
            neuron: self.neuron.overlay(&over.neuron),
        }
    }

    /// Fills in defaults. The auto-cast default depends on the resolved target, which is why it
    /// is decided here and not per source.
    pub fn resolve(&self) -> CompilerFlags {
        let target = self.target.unwrap_or(Target::Cpu);
        CompilerFlags {
            target,
            opt_level: self.opt_level.unwrap_or_default(),
            auto_cast: self.auto_cast.unwrap_or(default_auto_cast(target)),
            auto_cast_type: self.auto_cast_type.unwrap_or(AutoCastType::Bf16),
            model_type: self.model_type.unwrap_or(ModelType::Generic),
            retry_failed: self.retry_failed.unwrap_or(false),
            cache_dir: self.cache_dir.clone(),
            neuron: self.neuron.clone(),
        }
    }
}

/// The resolved compiler flags of one compilation.
///
/// `Default` is target `cpu`, `O2`, auto-cast `none` (Neuron's own default, `matmult`, applies
/// only when the target is `trn1`/`trn2`, see [`default_auto_cast`]), auto-cast type
/// `bf16`, model type `generic`, no retry of recorded failures, no cache dir.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CompilerFlags {
    /// The device family compiled for; default `cpu`.
    pub target: Target,
    /// The optimization level; default `O2`.
    pub opt_level: OptLevel,
    /// Which ops are cast to [`CompilerFlags::auto_cast_type`]; the default depends on the
    /// target (see [`default_auto_cast`]).
    pub auto_cast: AutoCast,
    /// The reduced precision auto-cast uses; default `bf16`.
    pub auto_cast_type: AutoCastType,
    /// Neuron's model-type hint; default `generic`.
    pub model_type: ModelType,
    /// Compile graphs again even when the cache holds a failure record for them.
    pub retry_failed: bool,
    /// Where compiled executables are cached (a path or URL); `None` leaves the choice to
    /// `NEURON_COMPILE_CACHE_URL` and the built-in default.
    pub cache_dir: Option<String>,
    /// `neuronx-cc` flags neuron-pc passes to Neuron's compiler on `trn1`/`trn2`; on cpu and
    /// cuda they have no meaning (see [`CompilerFlags::warn_unused_neuron_flags`]).
    pub neuron: NeuronFlags,
}

impl Default for CompilerFlags {
    fn default() -> Self {
        FlagOverrides::default().resolve()
    }
}

impl CompilerFlags {
    /// Parses a flag string in Neuron syntax over the defaults.
    pub fn parse(flags: &str) -> Result<CompilerFlags> {
        Ok(FlagOverrides::parse(flags)?.resolve())
    }

    /// The flags in `NEURON_CC_FLAGS` over the defaults.
    pub fn from_env() -> Result<CompilerFlags> {
        Ok(FlagOverrides::from_env()?.resolve())
    }

    /// `NEURON_CC_FLAGS` overlaid by flags given on the command line (the command line wins,
    /// flag by flag).
    pub fn from_env_and(command_line: &FlagOverrides) -> Result<CompilerFlags> {
        Ok(FlagOverrides::from_env()?.overlay(command_line).resolve())
    }

    /// Every field that changes the compiled executable, as `(name, value)` in a fixed order,
    /// for the cache key. All of them are listed even when one has no effect in a given
    /// combination (the cast type under `--auto-cast none`): a key split too finely costs one
    /// extra compile, a key split too coarsely hands out the wrong executable.
    ///
    /// `retry_failed` and `cache_dir` are left out: they decide whether and where an executable
    /// is looked up or compiled, not what is compiled, so the same executable must be found
    /// whatever their value (otherwise moving a cache would invalidate it).
    ///
    /// Pass-through `neuronx-cc` flags that change Neuron's code enter as `neuron.<name>` on
    /// `trn1`/`trn2` only, and only when set (so keys without them are unchanged); on cpu and
    /// cuda they change nothing, so they stay out and a fleet with a Neuron-style
    /// `NEURON_CC_FLAGS` still shares executables with one without.
    pub fn key_fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = vec![
            ("target", self.target.name().to_string()),
            ("optlevel", self.opt_level.number().to_string()),
            ("auto_cast", self.auto_cast.as_str().to_string()),
            ("auto_cast_type", self.auto_cast_type.as_str().to_string()),
            ("model_type", self.model_type.as_str().to_string()),
        ];
        if is_neuron(self.target) {
            fields.extend(self.neuron.key_fields());
        }
        fields
    }

    /// On a target whose compiler is not Neuron's, warns once per process naming the
    /// pass-through `neuronx-cc` flags, which mean nothing there; returns the names warned about
    /// by this call.
    pub fn warn_unused_neuron_flags(&self) -> Vec<String> {
        if is_neuron(self.target) || self.neuron.is_empty() {
            return Vec::new();
        }
        neuron::warn_unused(&self.neuron, self.target.name())
    }

    /// The arguments handed to the Neuron compiler (`neuronx-cc`) on `trn1`/`trn2`: every flag
    /// that changes the executable, in Neuron's own spelling. `retry_failed` and `cache_dir` are
    /// handled by neuron-pc's cache, not by the compiler, so they are not passed. On cpu and cuda
    /// nothing reads these arguments.
    pub fn to_neuron_args(&self) -> Vec<String> {
        let mut args = Vec::with_capacity(10);
        let mut push = |flag: &str, value: String| {
            args.push(flag.to_string());
            args.push(value);
        };
        push("--target", self.target.name().to_string());
        push("--optlevel", self.opt_level.number().to_string());
        push("--auto-cast", self.auto_cast.as_str().to_string());
        push("--auto-cast-type", self.auto_cast_type.as_str().to_string());
        push("--model-type", self.model_type.as_str().to_string());
        args.extend(self.neuron.to_args());
        args
    }
}

/// Prints every field in the syntax [`CompilerFlags::parse`] reads, so a printed set parses back
/// to an equal value (used in logs and in the cache's explanation of keys).
impl fmt::Display for CompilerFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "--target {} --optlevel {} --auto-cast {} --auto-cast-type {} --model-type {}",
            self.target.name(),
            self.opt_level,
            self.auto_cast,
            self.auto_cast_type,
            self.model_type
        )?;
        if !self.neuron.is_empty() {
            write!(f, " {}", self.neuron)?;
        }
        if self.retry_failed {
            f.write_str(" --retry_failed_compilation")?;
        }
        if let Some(dir) = &self.cache_dir {
            write!(f, " --cache_dir {}", words::quote_word(dir))?;
        }
        Ok(())
    }
}
