//! Finding the device toolchain (a rustc with the nvptx64 back end and the library source for
//! `-Zbuild-std=core`, and a cargo to drive it), and the clean environment the device cargo runs in.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::BuildError;

/// Debian's rustc (package `rustc-web`, rustc 1.96 with the nvptx64 back end).
pub const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
/// Debian's cargo (package `cargo-web`).
pub const DEBIAN_CARGO: &str = "/usr/bin/cargo";
/// The library source of Debian's rustc (package `rust-web-src`), needed by `-Zbuild-std=core`.
pub const DEBIAN_RUST_SRC: &str = "/usr/lib/rustlib/src/rust/library/core";
/// Debian's cargo-clippy for the same rustc (package `rust-web-clippy`).
pub const DEBIAN_CARGO_CLIPPY: &str = "/usr/bin/cargo-clippy";
/// Debian's clippy-driver (package `rust-web-clippy`).
pub const DEBIAN_CLIPPY_DRIVER: &str = "/usr/bin/clippy-driver";
/// The Debian packages of the device toolchain (what `cargo xtask setup` installs with apt).
pub const DEBIAN_PACKAGES: [&str; 4] =
    ["rustc-web", "cargo-web", "rust-web-src", "rust-web-clippy"];

/// Override: the rustc of the device build (a path, or a name looked up on `PATH`).
pub const ENV_DEVICE_RUSTC: &str = "WARPLINE_DEVICE_RUSTC";
/// Override: the cargo of the device build (a path, or a name looked up on `PATH`).
pub const ENV_DEVICE_CARGO: &str = "WARPLINE_DEVICE_CARGO";

/// Where a [`DeviceToolchain`] came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolchainSource {
    /// `WARPLINE_DEVICE_RUSTC` and/or `WARPLINE_DEVICE_CARGO` (the one not set defaults to
    /// Debian's).
    Override,
    /// Debian's `rustc-web`, `cargo-web` and `rust-web-src` under `/usr`.
    Debian,
    /// A rustup nightly toolchain with the `rust-src` component.
    RustupNightly,
}

/// The rustc and cargo that build kernel crates for `nvptx64-nvidia-cuda`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceToolchain {
    /// The rustc (set as `RUSTC` for the device cargo).
    pub rustc: PathBuf,
    /// The cargo that runs the device build.
    pub cargo: PathBuf,
    /// Where it was found.
    pub source: ToolchainSource,
}

/// What [`DeviceToolchain::discover_with`] asks of the machine (replaced in unit tests).
pub trait Probe {
    /// An environment variable, if set and not empty.
    fn var(&self, name: &str) -> Option<OsString>;
    /// Whether `path` exists.
    fn exists(&self, path: &Path) -> bool;
    /// The absolute path of an executable name found on `PATH`.
    fn which(&self, name: &str) -> Option<PathBuf>;
    /// rustup's nightly `(rustc, cargo)` when rustup exists, nightly is installed and has the
    /// `rust-src` component.
    fn rustup_nightly(&self) -> Option<(PathBuf, PathBuf)>;
}

/// The real machine: process environment, file system, `rustup which --toolchain nightly`.
pub struct SystemProbe;

impl Probe for SystemProbe {
    fn var(&self, name: &str) -> Option<OsString> {
        std::env::var_os(name).filter(|v| !v.is_empty())
    }
    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
    fn which(&self, name: &str) -> Option<PathBuf> {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    }
    fn rustup_nightly(&self) -> Option<(PathBuf, PathBuf)> {
        let rustup = self.which("rustup")?;
        let which = |tool: &str| -> Option<PathBuf> {
            let out = clean_command(&rustup)
                .args(["which", "--toolchain", "nightly", tool])
                .output()
                .ok()?;
            if !out.status.success() {
                return None;
            }
            let p = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
            p.is_file().then_some(p)
        };
        let rustc = which("rustc")?;
        let cargo = which("cargo")?;
        let out = clean_command(&rustc)
            .args(["--print", "sysroot"])
            .output()
            .ok()?;
        let sysroot = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
        sysroot
            .join("lib/rustlib/src/rust/library/core")
            .exists()
            .then_some((rustc, cargo))
    }
}

impl DeviceToolchain {
    /// Finds the device toolchain on this machine; see [`DeviceToolchain::discover_with`].
    ///
    /// # Errors
    /// [`BuildError::ToolchainMissing`] when none is found (its message names `cargo xtask setup`
    /// and the overrides).
    pub fn discover() -> Result<Self, BuildError> {
        Self::discover_with(&SystemProbe)
    }

    /// Finds the device toolchain, in this order:
    /// 1. the overrides `WARPLINE_DEVICE_RUSTC` / `WARPLINE_DEVICE_CARGO` (a path or a name on
    ///    `PATH`; the one not set defaults to Debian's); a set override that does not exist is an
    ///    error, not a fall-through;
    /// 2. Debian's `/usr/bin/rustc` + `/usr/bin/cargo` with `rust-web-src`
    ///    (`/usr/lib/rustlib/src/rust/library/core`);
    /// 3. rustup's `nightly` toolchain when it has the `rust-src` component.
    ///
    /// # Errors
    /// [`BuildError::ToolchainMissing`] listing what was tried.
    pub fn discover_with(probe: &dyn Probe) -> Result<Self, BuildError> {
        let mut tried = Vec::new();
        let rustc_override = probe.var(ENV_DEVICE_RUSTC);
        let cargo_override = probe.var(ENV_DEVICE_CARGO);
        if rustc_override.is_some() || cargo_override.is_some() {
            let resolve = |var: &str, value: Option<OsString>, default: &str| {
                let raw = value.map(PathBuf::from).unwrap_or_else(|| default.into());
                let found = if raw.components().count() == 1 && !raw.is_absolute() {
                    probe.which(&raw.to_string_lossy())
                } else {
                    Some(raw.clone()).filter(|p| probe.exists(p))
                };
                found.ok_or_else(|| format!("{var}: {} does not exist", raw.display()))
            };
            let rustc = resolve(ENV_DEVICE_RUSTC, rustc_override, DEBIAN_RUSTC);
            let cargo = resolve(ENV_DEVICE_CARGO, cargo_override, DEBIAN_CARGO);
            return match (rustc, cargo) {
                (Ok(rustc), Ok(cargo)) => Ok(DeviceToolchain {
                    rustc,
                    cargo,
                    source: ToolchainSource::Override,
                }),
                (r, c) => {
                    tried.extend(r.err());
                    tried.extend(c.err());
                    Err(BuildError::ToolchainMissing { tried })
                }
            };
        }
        let debian = [DEBIAN_RUSTC, DEBIAN_CARGO, DEBIAN_RUST_SRC];
        let missing: Vec<&str> = debian
            .iter()
            .copied()
            .filter(|p| !probe.exists(Path::new(p)))
            .collect();
        if missing.is_empty() {
            return Ok(DeviceToolchain {
                rustc: DEBIAN_RUSTC.into(),
                cargo: DEBIAN_CARGO.into(),
                source: ToolchainSource::Debian,
            });
        }
        tried.push(format!(
            "Debian rustc-web/cargo-web/rust-web-src: missing {}",
            missing.join(", ")
        ));
        if let Some((rustc, cargo)) = probe.rustup_nightly() {
            return Ok(DeviceToolchain {
                rustc,
                cargo,
                source: ToolchainSource::RustupNightly,
            });
        }
        tried.push("rustup nightly with rust-src: not found".into());
        Err(BuildError::ToolchainMissing { tried })
    }

    /// A `Command` running the device cargo (or `program`, e.g. Debian's `cargo-clippy`, when
    /// given) in a clean environment: see [`clean_command`]; `RUSTC`, `CARGO` and
    /// `RUSTC_BOOTSTRAP=1` are set, and `PATH` starts with the toolchain's own `bin` folder and
    /// has no rustup proxy folder (`~/.cargo/bin`).
    pub fn command(&self, program: Option<&Path>) -> Command {
        let mut cmd = clean_command(program.unwrap_or(&self.cargo));
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs: Vec<PathBuf> = self
            .rustc
            .parent()
            .map(Path::to_path_buf)
            .into_iter()
            .collect();
        dirs.extend(std::env::split_paths(&path).filter(|d| !d.ends_with(".cargo/bin")));
        if let Ok(p) = std::env::join_paths(dirs) {
            cmd.env("PATH", p);
        }
        cmd.env("RUSTC", &self.rustc)
            .env("CARGO", &self.cargo)
            .env("RUSTC_BOOTSTRAP", "1");
        cmd
    }
}

/// Whether a variable of the calling process must not reach the device cargo: everything cargo,
/// rustc or rustup set or read for the *outer* build (toolchain pin, wrappers, flags, target dir,
/// jobserver, `cargo fix` state, build-script variables) except cargo's home, network, registry and
/// terminal settings.
pub fn is_leaky_var(name: &str) -> bool {
    const KEEP: [&str; 6] = [
        "CARGO_HOME",
        "CARGO_NET_",
        "CARGO_HTTP_",
        "CARGO_REGISTRIES_",
        "CARGO_REGISTRY_",
        "CARGO_TERM_",
    ];
    const EXACT: [&str; 21] = [
        "RUSTUP_TOOLCHAIN",
        "RUSTC",
        "RUSTDOC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_LINKER",
        "RUSTFLAGS",
        "RUSTDOCFLAGS",
        "RUSTC_BOOTSTRAP",
        "MAKEFLAGS",
        "MFLAGS",
        "OUT_DIR",
        "TARGET",
        "HOST",
        "NUM_JOBS",
        "OPT_LEVEL",
        "DEBUG",
        "PROFILE",
        "RUST_RECURSION_COUNT",
        "RUSTC_BREAK_ON_ICE",
        "CARGO",
    ];
    if KEEP.iter().any(|k| name.starts_with(k)) {
        return false;
    }
    name.starts_with("CARGO_")
        || name.starts_with("__CARGO")
        || name.starts_with("DEP_")
        || EXACT.contains(&name)
}

/// A `Command` for `program` with every variable of [`is_leaky_var`] removed, so that a device
/// build started from a build script, xtask, CI or a shell is the same build.
pub fn clean_command(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    for (name, _) in std::env::vars_os() {
        if is_leaky_var(&name.to_string_lossy()) {
            cmd.env_remove(&name);
        }
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[derive(Default)]
    struct Fake {
        vars: HashMap<&'static str, &'static str>,
        files: Vec<&'static str>,
        on_path: HashMap<&'static str, &'static str>,
        nightly: bool,
    }

    impl Probe for Fake {
        fn var(&self, name: &str) -> Option<OsString> {
            self.vars.get(name).map(OsString::from)
        }
        fn exists(&self, path: &Path) -> bool {
            self.files.iter().any(|f| Path::new(f) == path)
        }
        fn which(&self, name: &str) -> Option<PathBuf> {
            self.on_path.get(name).map(PathBuf::from)
        }
        fn rustup_nightly(&self) -> Option<(PathBuf, PathBuf)> {
            self.nightly
                .then(|| ("/n/bin/rustc".into(), "/n/bin/cargo".into()))
        }
    }

    fn debian() -> Vec<&'static str> {
        vec![DEBIAN_RUSTC, DEBIAN_CARGO, DEBIAN_RUST_SRC]
    }

    #[test]
    fn debian_first_when_complete() {
        let f = Fake {
            files: debian(),
            nightly: true,
            ..Default::default()
        };
        let t = DeviceToolchain::discover_with(&f).unwrap();
        assert_eq!(t.source, ToolchainSource::Debian);
        assert_eq!(t.rustc, Path::new(DEBIAN_RUSTC));
    }

    #[test]
    fn rustup_nightly_when_debian_lacks_rust_src() {
        let f = Fake {
            files: vec![DEBIAN_RUSTC, DEBIAN_CARGO],
            nightly: true,
            ..Default::default()
        };
        let t = DeviceToolchain::discover_with(&f).unwrap();
        assert_eq!(t.source, ToolchainSource::RustupNightly);
        assert_eq!(t.cargo, Path::new("/n/bin/cargo"));
    }

    #[test]
    fn overrides_win_and_default_the_other_half_to_debian() {
        let f = Fake {
            vars: [(ENV_DEVICE_RUSTC, "/opt/r/rustc")].into(),
            files: vec!["/opt/r/rustc", DEBIAN_CARGO],
            ..Default::default()
        };
        let t = DeviceToolchain::discover_with(&f).unwrap();
        assert_eq!(t.source, ToolchainSource::Override);
        assert_eq!(t.rustc, Path::new("/opt/r/rustc"));
        assert_eq!(t.cargo, Path::new(DEBIAN_CARGO));

        let f = Fake {
            vars: [(ENV_DEVICE_CARGO, "cargo-nv")].into(),
            files: vec![DEBIAN_RUSTC],
            on_path: [("cargo-nv", "/x/cargo-nv")].into(),
            ..Default::default()
        };
        let t = DeviceToolchain::discover_with(&f).unwrap();
        assert_eq!(t.cargo, Path::new("/x/cargo-nv"));
    }

    #[test]
    fn a_broken_override_is_an_error_not_a_fallthrough() {
        let mut files = debian();
        files.push("/unused");
        let f = Fake {
            vars: [(ENV_DEVICE_RUSTC, "/nope/rustc")].into(),
            files,
            nightly: true,
            ..Default::default()
        };
        let e = DeviceToolchain::discover_with(&f).unwrap_err().to_string();
        assert!(e.contains("/nope/rustc does not exist"), "{e}");
    }

    #[test]
    fn missing_toolchain_names_setup_and_overrides() {
        let e = DeviceToolchain::discover_with(&Fake::default()).unwrap_err();
        assert!(matches!(e, BuildError::ToolchainMissing { .. }));
        let msg = e.to_string();
        for needle in [
            "cargo xtask setup",
            ENV_DEVICE_RUSTC,
            ENV_DEVICE_CARGO,
            "rust-src",
        ] {
            assert!(msg.contains(needle), "`{needle}` not in: {msg}");
        }
    }

    #[test]
    fn outer_cargo_variables_do_not_leak() {
        for leaky in [
            "RUSTUP_TOOLCHAIN",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_TARGET_DIR",
            "CARGO_MAKEFLAGS",
            "MAKEFLAGS",
            "RUSTC_WRAPPER",
            "RUSTFLAGS",
            "__CARGO_FIX_PLZ",
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_CFG_TARGET_OS",
            "CARGO_BUILD_TARGET",
            "OUT_DIR",
            "TARGET",
            "DEP_Z_INCLUDE",
            "CARGO",
        ] {
            assert!(is_leaky_var(leaky), "{leaky}");
        }
        for kept in [
            "CARGO_HOME",
            "CARGO_NET_OFFLINE",
            "RUSTUP_HOME",
            "PATH",
            "HOME",
        ] {
            assert!(!is_leaky_var(kept), "{kept}");
        }
    }
}
