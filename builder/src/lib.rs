//! # warpline-builder
//!
//! Builds a Rust kernel crate to one PTX module for `nvptx64-nvidia-cuda` (Hopper: `sm_90` or
//! `sm_90a`), from a build script or from an xtask, with rustc's own NVPTX back end:
//!
//! ```no_run
//! // build.rs of a host crate whose kernels live in ../kernels
//! use warpline_builder::{Arch, PtxBuilder};
//!
//! let b = PtxBuilder::new("../kernels").arch(Arch::Sm90);
//! b.emit_rerun_if_changed().unwrap();
//! let built = b.build().unwrap_or_else(|e| {
//!     eprintln!("{e}");
//!     std::process::exit(1)
//! });
//! println!("cargo:rustc-env=KERNELS_PTX={}", built.path.display());
//! // in the host crate: include_str!(env!("KERNELS_PTX"))
//! ```
//!
//! The kernel crate needs `crate-type = ["cdylib"]` (the post-LTO assembly of the cdylib is the
//! PTX), `#![no_std]` on nvptx64, a `#[panic_handler]` and the features
//! `#![feature(abi_ptx)]` (plus `stdarch_nvptx`, `asm_experimental_arch` if it uses them).
//!
//! What a build does:
//! 1. finds the device toolchain ([`DeviceToolchain::discover`]: `WARPLINE_DEVICE_RUSTC` /
//!    `WARPLINE_DEVICE_CARGO`, else Debian's `rustc-web`/`cargo-web`/`rust-web-src`, else rustup
//!    nightly with `rust-src`);
//! 2. runs `cargo build --release --target nvptx64-nvidia-cuda -Zbuild-std=core --manifest-path
//!    <crate>/Cargo.toml -p <package> --target-dir <target dir>` in a clean environment (no variable
//!    of the calling cargo leaks in: see [`toolchain::is_leaky_var`]) with
//!    `RUSTFLAGS` = [`PtxBuilder::rustflags`] plus `--emit=asm` (among them
//!    `-Cpanic=immediate-abort`: a panic is a `trap`, see there) and fat LTO, one codegen unit,
//!    `opt-level=3`, after checking the device rustc is at least [`MIN_DEVICE_RUSTC`];
//! 3. copies `<target dir>/nvptx64-nvidia-cuda/release/deps/<lib>.s` to `<out dir>/<lib>.ptx`,
//!    writing only when the text changed (so the mtime moves only on a real change), and checks the
//!    module's `.target` and `.version`;
//! 4. where ptxas is found ([`ptxas::find`]), assembles the module for the architecture and
//!    returns each kernel's resources and every ptxas warning; warnings that mean slow or wrong
//!    code and register spills fail the build ([`PtxBuilder::deny_ptxas_warnings`]).
//!
//! The same build from a shell: the `warpline-builder` binary or `cargo xtask build-kernel`
//! ([`cli`]).

#![deny(missing_docs)]

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub mod cli;
mod manifest;
pub mod ptxas;
pub mod toolchain;

pub use manifest::CrateNames;
pub use ptxas::{KernelResources, PtxasDiagnostic, PtxasReport};
pub use toolchain::{DeviceToolchain, ToolchainSource, ENV_DEVICE_CARGO, ENV_DEVICE_RUSTC};

/// Set to `1` to turn off [`PtxBuilder::deny_ptxas_warnings`]: ptxas's slow-or-wrong warnings and
/// spills are then reported in [`BuiltPtx::ptxas_diagnostics`] but do not fail the build.
pub const ENV_ALLOW_PTXAS_WARNINGS: &str = "WARPLINE_ALLOW_PTXAS_WARNINGS";

/// The oldest device rustc (`major.minor`) the builder accepts: the one it is tested with
/// (Debian's rustc-web 1.96), which has `-Cpanic=immediate-abort`.
pub const MIN_DEVICE_RUSTC: (u32, u32) = (1, 96);

/// The rustc target of every build.
pub const TARGET: &str = "nvptx64-nvidia-cuda";

/// The GPU architecture the PTX is generated for (`-C target-cpu`, ptxas `-arch`, PTX `.target`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Arch {
    /// `sm_90`: Hopper, forward-compatible PTX (the default).
    #[default]
    Sm90,
    /// `sm_90a`: Hopper with the architecture-specific features (wgmma, setmaxnreg, ...); such
    /// PTX runs only on compute capability 9.0 exactly. Needs PTX ISA 8.0 or newer.
    Sm90a,
}

impl Arch {
    /// The name rustc, ptxas and PTX use: `"sm_90"` or `"sm_90a"`.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm90 => "sm_90",
            Arch::Sm90a => "sm_90a",
        }
    }

    /// The oldest PTX ISA that has this target: 7.8 for `sm_90`, 8.0 for `sm_90a`.
    pub fn min_ptx_isa(self) -> PtxIsa {
        match self {
            Arch::Sm90 => PtxIsa::new(7, 8),
            Arch::Sm90a => PtxIsa::V8_0,
        }
    }
}

/// A PTX ISA version (`.version major.minor` in the module), chosen with rustc's target feature
/// `+ptx<major><minor>` (`+ptx80` for 8.0). rustc 1.96 knows 7.8 and 8.0 to 8.8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PtxIsa {
    /// Major version.
    pub major: u8,
    /// Minor version (0 to 9).
    pub minor: u8,
}

impl PtxIsa {
    /// PTX ISA 8.0 (CUDA 12.0), the default: enough for sm_90 and sm_90a, loadable by every CUDA
    /// 12 driver.
    pub const V8_0: PtxIsa = PtxIsa { major: 8, minor: 0 };
    /// PTX ISA 8.3 (CUDA 12.3): adds `fence.proxy.tensormap`, wanted by the TMA kernels.
    pub const V8_3: PtxIsa = PtxIsa { major: 8, minor: 3 };

    /// PTX ISA `major.minor`.
    pub const fn new(major: u8, minor: u8) -> Self {
        PtxIsa { major, minor }
    }

    /// The rustc target feature: `+ptx80` for 8.0.
    pub fn target_feature(self) -> String {
        format!("+ptx{}{}", self.major, self.minor)
    }
}

impl Default for PtxIsa {
    fn default() -> Self {
        PtxIsa::V8_0
    }
}

impl fmt::Display for PtxIsa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// What a build can fail with. Every message says what to do.
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// No device toolchain: the list says what was tried.
    ToolchainMissing {
        /// What was looked for and why it did not qualify.
        tried: Vec<String>,
    },
    /// A builder setting that cannot work (e.g. a PTX ISA too old for the architecture).
    Config {
        /// What is wrong and what is allowed.
        message: String,
    },
    /// A `Cargo.toml` that cannot be read as a kernel crate's manifest.
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A file or folder could not be read or written.
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The device cargo could not be started or failed (its diagnostics went to stderr).
    Cargo {
        /// The command, as run.
        command: String,
        /// Why: the exit status, or the error starting it.
        status: String,
    },
    /// The device build succeeded but left no PTX where expected (not a `cdylib`?).
    NoPtx {
        /// Where the `.s` file was expected.
        expected: PathBuf,
    },
    /// The emitted module is not what was asked for (`.target`/`.version` differ).
    WrongModule {
        /// What differs.
        message: String,
    },
    /// ptxas could not be run or rejected the module.
    Ptxas {
        /// ptxas's output or the error starting it.
        message: String,
    },
    /// ptxas accepted the module but warned that it is slow or wrong (a "Potential Performance
    /// Loss" note such as C7508 or C7515, a warning other than an `Advisory:`, or a register
    /// spill); see [`PtxBuilder::deny_ptxas_warnings`].
    PtxasWarnings {
        /// The module.
        module: PathBuf,
        /// One line per problem, ptxas's own text where it gave one.
        problems: Vec<String>,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::ToolchainMissing { tried } => write!(
                f,
                "no device toolchain for {TARGET} (a rustc with the NVPTX back end and the rust-src \
                 library source for -Zbuild-std=core) was found.\n\
                 tried:\n  - {}\n\
                 fix: run `cargo xtask setup` (installs Debian's rustc-web, cargo-web, rust-web-src and ptxas),\n\
                 \x20    or point {ENV_DEVICE_RUSTC} and {ENV_DEVICE_CARGO} at a rustc/cargo that have them,\n\
                 \x20    or install a rustup nightly with rust-src (`rustup toolchain install nightly --component rust-src`).",
                tried.join("\n  - ")
            ),
            BuildError::Config { message } => write!(f, "PTX builder: {message}"),
            BuildError::Manifest { path, message } => {
                write!(f, "kernel crate manifest {}: {message}", path.display())
            }
            BuildError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            BuildError::Cargo { command, status } => write!(
                f,
                "the device build failed ({status}); its diagnostics are above.\ncommand: {command}"
            ),
            BuildError::NoPtx { expected } => write!(
                f,
                "the device build left no PTX at {}; the kernel crate needs crate-type = [\"cdylib\"]",
                expected.display()
            ),
            BuildError::WrongModule { message } => write!(f, "emitted PTX module: {message}"),
            BuildError::Ptxas { message } => write!(f, "ptxas: {message}"),
            BuildError::PtxasWarnings { module, problems } => write!(
                f,
                "ptxas warns that {} is slow or wrong:\n  - {}\n\
                 fix the kernel (docs/writing-kernels.md §5 names the usual causes), or accept the \
                 warnings with `.deny_ptxas_warnings(false)` on the PtxBuilder or \
                 {ENV_ALLOW_PTXAS_WARNINGS}=1",
                module.display(),
                problems.join("\n  - ")
            ),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BuildError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> BuildError + '_ {
    move |source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A built PTX module.
#[derive(Clone, Debug)]
pub struct BuiltPtx {
    /// The module: `<out dir>/<lib name>.ptx` (absolute).
    pub path: PathBuf,
    /// Its kernels (`.entry` names), in module order.
    pub entries: Vec<String>,
    /// Each kernel's resources from ptxas for the builder's architecture; `None` when no ptxas was
    /// found or [`PtxBuilder::ptxas`] turned it off.
    pub resources: Option<Vec<KernelResources>>,
    /// Every ptxas warning and numbered (`Cnnnn`) note, harmful or not; empty when ptxas did not
    /// run.
    pub ptxas_diagnostics: Vec<PtxasDiagnostic>,
    /// `ptxas --version`'s `release X.Y`, when ptxas ran.
    pub ptxas_release: Option<String>,
    /// The device rustc's `rustc --version` line.
    pub rustc_version: String,
}

/// Builds one kernel crate to PTX. See the crate docs for what a build runs.
#[derive(Clone, Debug)]
pub struct PtxBuilder {
    crate_dir: PathBuf,
    arch: Arch,
    ptx_isa: PtxIsa,
    out_dir: Option<PathBuf>,
    target_dir: Option<PathBuf>,
    extra_rustflags: Vec<String>,
    toolchain: Option<DeviceToolchain>,
    run_ptxas: bool,
    deny_ptxas_warnings: bool,
    spill_allowances: Vec<ptxas::SpillAllowance>,
    features: Vec<String>,
}

impl PtxBuilder {
    /// A builder for the kernel crate in `kernel_crate_dir` (the folder of its `Cargo.toml`;
    /// relative paths are taken from the current directory, which in a build script is the
    /// manifest folder of the crate being built). Defaults: `sm_90`, PTX ISA 8.0, out dir as
    /// [`PtxBuilder::out_dir`] says, ptxas run when found.
    pub fn new(kernel_crate_dir: impl Into<PathBuf>) -> Self {
        PtxBuilder {
            crate_dir: kernel_crate_dir.into(),
            arch: Arch::default(),
            ptx_isa: PtxIsa::default(),
            out_dir: None,
            target_dir: None,
            extra_rustflags: Vec::new(),
            toolchain: None,
            run_ptxas: true,
            deny_ptxas_warnings: true,
            spill_allowances: Vec::new(),
            features: Vec::new(),
        }
    }

    /// The architecture (default `sm_90`).
    pub fn arch(mut self, arch: Arch) -> Self {
        self.arch = arch;
        self
    }

    /// The PTX ISA (default 8.0). At least [`Arch::min_ptx_isa`], else `build` fails with
    /// [`BuildError::Config`].
    pub fn ptx_isa(mut self, isa: PtxIsa) -> Self {
        self.ptx_isa = isa;
        self
    }

    /// Where `<lib name>.ptx` is written. Default: `$OUT_DIR` when `OUT_DIR` is set (a build
    /// script), else `<kernel crate>/target/ptx`.
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.out_dir = Some(dir.into());
        self
    }

    /// The device cargo's `--target-dir` (never the calling cargo's target directory, whose lock
    /// the calling cargo holds while a build script runs). Default: `$OUT_DIR/nvptx-target` in a
    /// build script, else `<kernel crate>/target/nvptx`. Builds with the same settings can share one
    /// (core is then compiled once).
    pub fn target_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.target_dir = Some(dir.into());
        self
    }

    /// More rustc flags for the kernel crates (appended to `RUSTFLAGS`, one flag an item, e.g.
    /// `["-C", "llvm-args=-nvptx-sched4reg"]`).
    pub fn extra_rustflags<I, S>(mut self, flags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.extra_rustflags
            .extend(flags.into_iter().map(Into::into));
        self
    }

    /// Use this toolchain instead of [`DeviceToolchain::discover`].
    pub fn toolchain(mut self, toolchain: DeviceToolchain) -> Self {
        self.toolchain = Some(toolchain);
        self
    }

    /// Cargo features of the kernel crate to enable (`--features`), e.g. one that selects the
    /// kernels of an `sm_90a` module. Builds with different features need different
    /// [`PtxBuilder::target_dir`]s (the module file has the same name).
    pub fn features<I, S>(mut self, features: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.features.extend(features.into_iter().map(Into::into));
        self
    }

    /// Whether to run ptxas (when found) for the resource report (default true).
    pub fn ptxas(mut self, run: bool) -> Self {
        self.run_ptxas = run;
        self
    }

    /// Whether ptxas's slow-or-wrong warnings and register spills fail the build (default true):
    /// see [`PtxasDiagnostic::is_harmful`]. `WARPLINE_ALLOW_PTXAS_WARNINGS=1` in the environment
    /// turns it off too. Every diagnostic is in [`BuiltPtx::ptxas_diagnostics`] either way.
    pub fn deny_ptxas_warnings(mut self, deny: bool) -> Self {
        self.deny_ptxas_warnings = deny;
        self
    }

    /// Lets `kernel` spill up to `max_bytes` of spill stores and of spill loads per thread
    /// without failing the build ([`PtxBuilder::deny_ptxas_warnings`]); more still fails. For a
    /// kernel whose spills lie outside its hot loop and were measured to cost nothing: say why
    /// where this is called.
    pub fn allow_spills(mut self, kernel: impl Into<String>, max_bytes: u32) -> Self {
        self.spill_allowances.push(ptxas::SpillAllowance {
            kernel: kernel.into(),
            max_bytes,
        });
        self
    }

    /// The kernel crate's folder, as given.
    pub fn crate_dir(&self) -> &Path {
        &self.crate_dir
    }

    /// The `RUSTFLAGS` of the device build without `--emit=asm` (also right for clippy on it):
    /// `-C target-cpu=<arch> -C target-feature=+ptx<isa> -C linker=/bin/true
    /// -Zmir-enable-passes=-JumpThreading -Zunstable-options -Cpanic=immediate-abort` and the
    /// extra flags.
    ///
    /// MIR jump threading is off because it can duplicate a warp-synchronous `asm!` (`bar.sync`,
    /// `*.sync.aligned`) into divergent branches, which deadlocks (rust-lang/rust#137086; inline
    /// asm is not `convergent`).
    ///
    /// The panic strategy `immediate-abort` (applied to `core` too, which `-Zbuild-std` builds
    /// with these flags) makes every panic (a failed bounds check, a division by zero, `assert!`,
    /// `unwrap` on `None`) a `trap` in place: without it core's `panic_*` functions stay extern
    /// and ptxas fails with "Unresolved extern function '..core9panicking..'". A trapped kernel
    /// stops its launch with a sticky error (`CUDA_ERROR_ILLEGAL_INSTRUCTION` or
    /// `CUDA_ERROR_LAUNCH_FAILED`), which the warpline host reports as `Error::ContextPoisoned`.
    pub fn rustflags(&self) -> String {
        let mut flags = format!(
            "-C target-cpu={} -C target-feature={} -C linker=/bin/true -Zmir-enable-passes=-JumpThreading -Zunstable-options -Cpanic=immediate-abort",
            self.arch.name(),
            self.ptx_isa.target_feature()
        );
        for f in &self.extra_rustflags {
            flags.push(' ');
            flags.push_str(f);
        }
        flags
    }

    fn resolved_out_dir(&self) -> PathBuf {
        self.out_dir
            .clone()
            .unwrap_or_else(|| match std::env::var_os("OUT_DIR") {
                Some(d) => PathBuf::from(d),
                None => self.crate_dir.join("target/ptx"),
            })
    }

    fn resolved_target_dir(&self) -> PathBuf {
        self.target_dir
            .clone()
            .unwrap_or_else(|| match std::env::var_os("OUT_DIR") {
                Some(d) => PathBuf::from(d).join("nvptx-target"),
                None => self.crate_dir.join("target/nvptx"),
            })
    }

    /// The kernel crate's package and library names, from its `Cargo.toml`.
    ///
    /// # Errors
    /// [`BuildError::Io`] / [`BuildError::Manifest`] when the manifest cannot be read or has no
    /// `[package] name`.
    pub fn crate_names(&self) -> Result<CrateNames, BuildError> {
        manifest::names(&self.crate_dir)
    }

    /// Every path whose change must rebuild the PTX: for the kernel crate and, transitively, each
    /// path dependency (`path = "..."`, also through `workspace = true`): its `Cargo.toml`, its
    /// `build.rs`, its `src/` folder and every file under it. Absolute where the crate exists.
    ///
    /// # Errors
    /// [`BuildError::Io`] / [`BuildError::Manifest`] for a manifest that cannot be read.
    pub fn rerun_if_changed_paths(&self) -> Result<Vec<PathBuf>, BuildError> {
        manifest::rerun_paths(&self.crate_dir)
    }

    /// For a build script: prints `cargo:rerun-if-changed=` for each of
    /// [`PtxBuilder::rerun_if_changed_paths`] (and the rustc of a toolchain set with
    /// [`PtxBuilder::toolchain`]) and `cargo:rerun-if-env-changed=` for
    /// `WARPLINE_DEVICE_RUSTC`, `WARPLINE_DEVICE_CARGO` and `PTXAS`.
    ///
    /// # Errors
    /// As [`PtxBuilder::rerun_if_changed_paths`].
    pub fn emit_rerun_if_changed(&self) -> Result<(), BuildError> {
        for p in self.rerun_if_changed_paths()? {
            println!("cargo:rerun-if-changed={}", p.display());
        }
        if let Some(t) = &self.toolchain {
            // An upgraded device rustc must rebuild the module too.
            println!("cargo:rerun-if-changed={}", t.rustc.display());
        }
        for v in [ENV_DEVICE_RUSTC, ENV_DEVICE_CARGO, ptxas::ENV_PTXAS] {
            println!("cargo:rerun-if-env-changed={v}");
        }
        Ok(())
    }

    /// Builds the PTX module; see the crate docs for the steps. The device cargo's diagnostics
    /// go to this process's stderr (its stdout too, so nothing reaches a build script's stdout).
    ///
    /// # Errors
    /// [`BuildError::ToolchainMissing`], [`BuildError::Config`], [`BuildError::Manifest`],
    /// [`BuildError::Cargo`] (compile errors), [`BuildError::NoPtx`], [`BuildError::WrongModule`],
    /// [`BuildError::Io`], [`BuildError::Ptxas`] (ptxas found and rejected the module).
    pub fn build(&self) -> Result<BuiltPtx, BuildError> {
        if self.ptx_isa < self.arch.min_ptx_isa() {
            return Err(BuildError::Config {
                message: format!(
                    "{} needs PTX ISA {} or newer, {} was asked for",
                    self.arch.name(),
                    self.arch.min_ptx_isa(),
                    self.ptx_isa
                ),
            });
        }
        let toolchain = match &self.toolchain {
            Some(t) => t.clone(),
            None => DeviceToolchain::discover()?,
        };
        let rustc_version = check_rustc_version(&toolchain)?;
        let crate_dir = self
            .crate_dir
            .canonicalize()
            .map_err(io_err(&self.crate_dir))?;
        let names = manifest::names(&crate_dir)?;
        // Relative folders are taken from the current directory (the device cargo runs in the
        // kernel crate's folder, so they are made absolute first).
        let absolute = |p: PathBuf| std::path::absolute(&p).map_err(io_err(&p));
        let out_dir = absolute(self.resolved_out_dir())?;
        let target_dir = absolute(self.resolved_target_dir())?;
        fs::create_dir_all(&out_dir).map_err(io_err(&out_dir))?;
        fs::create_dir_all(&target_dir).map_err(io_err(&target_dir))?;

        let mut cmd = toolchain.command(None);
        cmd.current_dir(&crate_dir)
            .env("RUSTFLAGS", format!("{} --emit=asm", self.rustflags()))
            .envs(PROFILE_ENV)
            .args(["build", "--release", "--target", TARGET, "-Zbuild-std=core"]);
        self.package_args(&mut cmd, &crate_dir, &names, &target_dir);
        run_device_cargo(cmd, &toolchain.cargo)?;

        let emitted = target_dir
            .join(TARGET)
            .join("release/deps")
            .join(format!("{}.s", names.lib));
        let ptx = match fs::read_to_string(&emitted) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(BuildError::NoPtx { expected: emitted })
            }
            Err(e) => return Err(io_err(&emitted)(e)),
        };
        self.check_module(&ptx)?;
        let ptx = apply_launch_bounds(&ptx)?;
        let out = out_dir.join(format!("{}.ptx", names.lib));
        if fs::read_to_string(&out).ok().as_deref() != Some(ptx.as_str()) {
            // Write then rename, so a reader never sees half a module.
            let tmp = out.with_extension("ptx.tmp");
            fs::write(&tmp, &ptx).map_err(io_err(&tmp))?;
            fs::rename(&tmp, &out).map_err(io_err(&out))?;
        }
        let path = out.canonicalize().map_err(io_err(&out))?;
        let (resources, ptxas_diagnostics, ptxas_release) = match (self.run_ptxas, ptxas::find()) {
            (true, Some(p)) => {
                let report = ptxas::assemble_report(&p, &path, self.arch)?;
                let problems = report.problems_allowing(&self.spill_allowances);
                let allowed = std::env::var(ENV_ALLOW_PTXAS_WARNINGS).is_ok_and(|v| v == "1");
                if self.deny_ptxas_warnings && !allowed && !problems.is_empty() {
                    return Err(BuildError::PtxasWarnings {
                        module: path,
                        problems,
                    });
                }
                (Some(report.kernels), report.diagnostics, ptxas::release(&p))
            }
            _ => (None, Vec::new(), None),
        };
        Ok(BuiltPtx {
            path,
            entries: ptx_entries(&ptx),
            resources,
            ptxas_diagnostics,
            ptxas_release,
            rustc_version,
        })
    }

    /// Runs the device clippy over the kernel crate: Debian's `cargo-clippy` (package
    /// `rust-web-clippy`, [`toolchain::DEBIAN_CARGO_CLIPPY`]) with the device build's flags
    /// ([`PtxBuilder::rustflags`]), profile and target, and `-- -D warnings`, in the target folder
    /// `<target dir>-clippy` (clippy's results do not mix with the build's). The crate's own
    /// `#![deny(...)]` lints apply; clippy's diagnostics go to stderr.
    ///
    /// # Errors
    /// [`BuildError::ToolchainMissing`], [`BuildError::Manifest`], [`BuildError::Io`],
    /// [`BuildError::Cargo`] (a lint fired, or cargo-clippy could not start: the message names
    /// the command).
    pub fn clippy(&self) -> Result<(), BuildError> {
        let toolchain = match &self.toolchain {
            Some(t) => t.clone(),
            None => DeviceToolchain::discover()?,
        };
        let crate_dir = self
            .crate_dir
            .canonicalize()
            .map_err(io_err(&self.crate_dir))?;
        let names = manifest::names(&crate_dir)?;
        let build_dir = std::path::absolute(self.resolved_target_dir())
            .map_err(io_err(&self.resolved_target_dir()))?;
        let mut dir_name = build_dir.file_name().unwrap_or_default().to_os_string();
        dir_name.push("-clippy");
        let target_dir = build_dir.with_file_name(dir_name);
        fs::create_dir_all(&target_dir).map_err(io_err(&target_dir))?;
        let clippy = Path::new(toolchain::DEBIAN_CARGO_CLIPPY);
        let mut cmd = toolchain.command(Some(clippy));
        cmd.current_dir(&crate_dir)
            .env("RUSTFLAGS", self.rustflags())
            .envs(PROFILE_ENV)
            .args([
                "clippy",
                "--release",
                "--target",
                TARGET,
                "-Zbuild-std=core",
            ]);
        self.package_args(&mut cmd, &crate_dir, &names, &target_dir);
        cmd.args(["--", "-D", "warnings"]);
        run_device_cargo(cmd, clippy)
    }

    /// `--features`, `--manifest-path`, `-p`, `--target-dir` and the output routing of a device
    /// cargo command.
    fn package_args(
        &self,
        cmd: &mut Command,
        crate_dir: &Path,
        names: &CrateNames,
        target_dir: &Path,
    ) {
        if !self.features.is_empty() {
            cmd.args(["--features", &self.features.join(",")]);
        }
        cmd.arg("--manifest-path")
            .arg(crate_dir.join("Cargo.toml"))
            .args(["-p", &names.package])
            .arg("--target-dir")
            .arg(target_dir)
            .stdout(Stdio::from(io::stderr()))
            .stderr(Stdio::inherit());
    }

    fn check_module(&self, ptx: &str) -> Result<(), BuildError> {
        let directive = |d: &str| {
            ptx.lines()
                .find_map(|l| l.trim().strip_prefix(d))
                .map(|v| v.trim().to_string())
        };
        let want_target = self.arch.name();
        let want_version = self.ptx_isa.to_string();
        let target = directive(".target ");
        let version = directive(".version ");
        if target.as_deref() != Some(want_target) || version.as_deref() != Some(&want_version) {
            return Err(BuildError::WrongModule {
                message: format!(
                    "asked for .target {want_target} .version {want_version}, got .target {} .version {} \
                     (is PTX ISA {want_version} known to this rustc? `rustc --print target-features --target {TARGET}` lists the ptxNN features)",
                    target.as_deref().unwrap_or("(none)"),
                    version.as_deref().unwrap_or("(none)")
                ),
            });
        }
        Ok(())
    }
}

/// Runs `<rustc> --version` and refuses a rustc older than [`MIN_DEVICE_RUSTC`].
fn check_rustc_version(toolchain: &DeviceToolchain) -> Result<String, BuildError> {
    let out = toolchain::clean_command(&toolchain.rustc)
        .arg("--version")
        .output()
        .map_err(|e| BuildError::Config {
            message: format!("could not run {} --version: {e}", toolchain.rustc.display()),
        })?;
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    match parse_rustc_version(&line) {
        Some(v) if v >= MIN_DEVICE_RUSTC => Ok(line),
        _ => Err(BuildError::Config {
            message: format!(
                "the device rustc {} is `{line}`; the builder needs rustc {}.{} or newer \
                 (tested: Debian rustc-web 1.96; `cargo xtask setup` installs it)",
                toolchain.rustc.display(),
                MIN_DEVICE_RUSTC.0,
                MIN_DEVICE_RUSTC.1
            ),
        }),
    }
}

/// `(major, minor)` of a `rustc --version` line (`rustc 1.96.0 (ac68faa20 2026-05-25)`,
/// `rustc 1.97.0-nightly (...)`).
pub fn parse_rustc_version(line: &str) -> Option<(u32, u32)> {
    let v = line.strip_prefix("rustc ")?.split_whitespace().next()?;
    let mut parts = v.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Prefix of the marker globals that `warpline_device::launch_bounds!` puts in the module:
/// `warpline_launch_bounds__<entry>`, 8 bytes = max threads per CTA, min CTAs per SM (u32 LE).
pub const LAUNCH_BOUNDS_PREFIX: &str = "warpline_launch_bounds__";

/// rustc emits no launch bounds, but ptxas needs them to honour `setmaxnreg` (C7508, "unable to
/// determine register count at entry") and to cap registers for large CTAs. For each marker
/// global [`LAUNCH_BOUNDS_PREFIX`]`<entry>` in the module, inserts `.maxntid T, 1, 1` and
/// `.minnctapersm C` (PTX ISA §11.4 "Performance-Tuning Directives") between the entry's
/// parameter list and its body. Modules without markers are returned unchanged.
///
/// # Errors
/// [`BuildError::WrongModule`] when a marker is malformed or names no entry of the module.
pub fn apply_launch_bounds(ptx: &str) -> Result<String, BuildError> {
    let bad = |message: String| BuildError::WrongModule { message };
    let mut bounds = Vec::new();
    for line in ptx.lines() {
        let Some(rest) = line.split(LAUNCH_BOUNDS_PREFIX).nth(1) else {
            continue;
        };
        if !line.contains(".global") {
            continue; // a use of the marker, not its definition
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '$')
            .collect();
        // LLVM drops trailing zero bytes of an initialiser (`{128, 1, 0, 0, 1}`): pad them back.
        let mut bytes: Vec<u32> = line
            .split_once('{')
            .and_then(|(_, b)| b.split_once('}'))
            .map(|(b, _)| b.split(',').filter_map(|v| v.trim().parse().ok()).collect())
            .unwrap_or_default();
        if bytes.is_empty() || bytes.len() > 8 || bytes.iter().any(|b| *b > 255) {
            return Err(bad(format!(
                "launch-bounds marker for `{name}` is not 8 initialised bytes: {line}"
            )));
        }
        bytes.resize(8, 0);
        let word = |i: usize| bytes[i..i + 4].iter().rev().fold(0u32, |a, b| a << 8 | b);
        bounds.push((name, word(0), word(4)));
    }
    if bounds.is_empty() {
        return Ok(ptx.to_string());
    }
    let mut out = String::with_capacity(ptx.len() + 64 * bounds.len());
    let mut pending: Option<(u32, u32)> = None;
    let mut found = vec![false; bounds.len()];
    for line in ptx.lines() {
        if let Some(rest) = line.trim().split(".entry ").nth(1) {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '$')
                .collect();
            if let Some(i) = bounds.iter().position(|b| b.0 == name) {
                found[i] = true;
                pending = Some((bounds[i].1, bounds[i].2));
            }
        }
        if pending.is_some() && line.trim() == "{" {
            let (threads, ctas) = pending.take().unwrap_or_default();
            out.push_str(&format!(".maxntid {threads}, 1, 1\n.minnctapersm {ctas}\n"));
        }
        out.push_str(line);
        out.push('\n');
    }
    if let Some(i) = found.iter().position(|f| !f) {
        return Err(bad(format!(
            "launch-bounds marker names `{}`, which is not an entry of the module",
            bounds[i].0
        )));
    }
    Ok(out)
}

/// The kernel (`.entry`) names of a PTX module, in module order.
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            let rest = l.trim().split(".entry ").nth(1)?;
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// The release profile of every device build and clippy run (fat LTO, one codegen unit, panic
/// abort, `-O3`, no debug info), as `CARGO_PROFILE_RELEASE_*` variables so that the kernel crate's
/// own `[profile]` cannot change them.
pub const PROFILE_ENV: [(&str, &str); 5] = [
    ("CARGO_PROFILE_RELEASE_LTO", "fat"),
    ("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1"),
    ("CARGO_PROFILE_RELEASE_PANIC", "abort"),
    ("CARGO_PROFILE_RELEASE_OPT_LEVEL", "3"),
    ("CARGO_PROFILE_RELEASE_DEBUG", "false"),
];

/// Runs a device cargo command; [`BuildError::Cargo`] naming it when it cannot start or fails.
fn run_device_cargo(mut cmd: Command, program: &Path) -> Result<(), BuildError> {
    let shown = format!("{cmd:?}");
    let status = cmd.status().map_err(|e| BuildError::Cargo {
        command: shown.clone(),
        status: format!("could not start {}: {e}", program.display()),
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(BuildError::Cargo {
            command: shown,
            status: status.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-kernel")
    }

    #[test]
    fn flags_follow_arch_and_isa() {
        let b = PtxBuilder::new("k")
            .arch(Arch::Sm90a)
            .ptx_isa(PtxIsa::new(8, 4))
            .extra_rustflags(["-C", "llvm-args=-x"]);
        assert_eq!(
            b.rustflags(),
            "-C target-cpu=sm_90a -C target-feature=+ptx84 -C linker=/bin/true -Zmir-enable-passes=-JumpThreading -Zunstable-options -Cpanic=immediate-abort -C llvm-args=-x"
        );
        assert_eq!(
            PtxBuilder::new("k").rustflags(),
            "-C target-cpu=sm_90 -C target-feature=+ptx80 -C linker=/bin/true -Zmir-enable-passes=-JumpThreading -Zunstable-options -Cpanic=immediate-abort"
        );
    }

    #[test]
    fn launch_bounds_go_between_parameters_and_body() {
        let ptx = ".version 8.3\n.target sm_90a\n\
            .visible .global .align 4 .b8 warpline_launch_bounds__k1[8] = {128, 1, 0, 0, 1};\n\
            .visible .entry k1(\n\t.param .u64 k1_param_0\n)\n{\n\tret;\n}\n\
            .visible .entry k2()\n{\n\tret;\n}\n";
        let out = apply_launch_bounds(ptx).unwrap();
        assert!(
            out.contains(")\n.maxntid 384, 1, 1\n.minnctapersm 1\n{\n\tret;"),
            "{out}"
        );
        assert_eq!(
            out.matches(".maxntid").count(),
            1,
            "k2 has no marker: {out}"
        );
        assert_eq!(
            apply_launch_bounds(".entry k()\n{\n}\n").unwrap(),
            ".entry k()\n{\n}\n"
        );
        let e = apply_launch_bounds(
            ".global .align 4 .b8 warpline_launch_bounds__gone[8] = {32, 0, 0, 0, 1, 0, 0, 0};\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("not an entry"), "{e}");
        let e = apply_launch_bounds(".global .align 4 .b8 warpline_launch_bounds__k[8];\n")
            .unwrap_err();
        assert!(e.to_string().contains("not 8 initialised bytes"), "{e}");
    }

    #[test]
    fn sm_90a_refuses_ptx_isa_below_8_0() {
        let e = PtxBuilder::new(fixture())
            .arch(Arch::Sm90a)
            .ptx_isa(PtxIsa::new(7, 8))
            .build()
            .unwrap_err();
        assert!(matches!(e, BuildError::Config { .. }), "{e}");
        assert!(e.to_string().contains("sm_90a needs PTX ISA 8.0"), "{e}");
    }

    #[test]
    fn module_directives_are_checked() {
        let b = PtxBuilder::new("k");
        assert!(b.check_module(".version 8.0\n.target sm_90\n").is_ok());
        let e = b.check_module(".version 7.8\n.target sm_90\n").unwrap_err();
        assert!(
            e.to_string().contains("got .target sm_90 .version 7.8"),
            "{e}"
        );
    }

    #[test]
    fn rustc_versions_are_parsed() {
        assert_eq!(
            parse_rustc_version(
                "rustc 1.96.0 (ac68faa20 2026-05-25) (built from a source tarball)"
            ),
            Some((1, 96))
        );
        assert_eq!(
            parse_rustc_version("rustc 1.97.0-nightly (abc 2026-06-01)"),
            Some((1, 97))
        );
        assert_eq!(parse_rustc_version("cargo 1.96.0"), None);
        assert!(parse_rustc_version("rustc 1.95.0 (x)").unwrap() < MIN_DEVICE_RUSTC);
    }

    #[test]
    fn entries_are_read_in_order() {
        let ptx = ".visible .entry fill(\n.param .u64 a\n)\n.func helper(\n.entry other_k()\n";
        assert_eq!(ptx_entries(ptx), ["fill", "other_k"]);
    }

    #[test]
    fn names_come_from_the_manifest() {
        let n = PtxBuilder::new(fixture()).crate_names().unwrap();
        assert_eq!(n.package, "tiny-kernel");
        assert_eq!(n.lib, "tiny_kernel");
    }

    #[test]
    fn rerun_list_covers_sources_manifests_and_path_deps() {
        let root =
            std::env::temp_dir().join(format!("warpline-builder-rerun-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let w = |p: &str, s: &str| {
            let p = root.join(p);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, s).unwrap();
        };
        w(
            "Cargo.toml",
            "[workspace]\nmembers=[\"k\",\"lib\",\"wsdep\"]\n[workspace.dependencies]\nwsdep = { path = \"wsdep\" }\n",
        );
        w(
            "k/Cargo.toml",
            "[package]\nname=\"k\"\n[dependencies]\nlib = { path = \"../lib\" }\nwsdep.workspace = true\nserde = \"1\"\n[dev-dependencies]\ndevonly = { path = \"../devonly\" }\n",
        );
        w("k/build.rs", "fn main(){}");
        w("k/src/lib.rs", "");
        w("k/src/kernels/a.rs", "");
        w(
            "lib/Cargo.toml",
            "[package]\nname=\"lib\"\n[dependencies]\ndeep = { path = \"../deep\" }\n",
        );
        w("lib/src/lib.rs", "");
        w("deep/Cargo.toml", "[package]\nname=\"deep\"\n");
        w("deep/src/lib.rs", "");
        w("wsdep/Cargo.toml", "[package]\nname=\"wsdep\"\n");
        w("wsdep/src/lib.rs", "");
        w("devonly/Cargo.toml", "[package]\nname=\"devonly\"\n");
        w("devonly/src/lib.rs", "");
        let root = root.canonicalize().unwrap();
        let got = PtxBuilder::new(root.join("k"))
            .rerun_if_changed_paths()
            .unwrap();
        let rel: Vec<String> = got
            .iter()
            .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
            .collect();
        let mut want = vec![
            "deep/Cargo.toml",
            "deep/src",
            "deep/src/lib.rs",
            "k/Cargo.toml",
            "k/build.rs",
            "k/src",
            "k/src/kernels/a.rs",
            "k/src/lib.rs",
            "lib/Cargo.toml",
            "lib/src",
            "lib/src/lib.rs",
            "wsdep/Cargo.toml",
            "wsdep/src",
            "wsdep/src/lib.rs",
        ];
        want.sort();
        assert_eq!(rel, want);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_missing_manifest_is_an_io_error_naming_it() {
        let e = PtxBuilder::new("/nonexistent/kernels")
            .crate_names()
            .unwrap_err();
        assert!(
            e.to_string().contains("/nonexistent/kernels/Cargo.toml"),
            "{e}"
        );
    }
}
