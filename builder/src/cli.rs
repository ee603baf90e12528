//! The builder's command line, shared by the `warpline-builder` binary and
//! `cargo xtask build-kernel`:
//!
//! ```text
//! warpline-builder <kernel crate dir> [--arch sm_90|sm_90a] [--ptx-isa 8.3]
//!     [--features a,b] [--out-dir DIR] [--target-dir DIR] [--allow-ptxas-warnings]
//! ```
//!
//! It runs [`PtxBuilder::build`] (the same flags, `launch_bounds!` rewrite and ptxas checks as a
//! build script gets) and prints the module's path, its kernels, each kernel's ptxas resources
//! and every ptxas warning.

use std::path::PathBuf;

use crate::{ptxas, Arch, PtxBuilder, PtxIsa};

/// The usage text.
pub const USAGE: &str =
    "usage: warpline-builder <kernel crate dir> [--arch sm_90|sm_90a] [--ptx-isa MAJOR.MINOR] \
[--features a,b] [--out-dir DIR] [--target-dir DIR] [--allow-ptxas-warnings] [--clippy]\n\
Builds the kernel crate to one PTX module (default: sm_90, PTX ISA 8.0 (8.3 for sm_90a), \
<crate>/target/ptx/<lib>.ptx) and checks it with ptxas; ptxas's slow-or-wrong warnings and spills \
fail the build unless --allow-ptxas-warnings. --clippy runs the device clippy (Debian's \
cargo-clippy, the build's flags, -D warnings) instead of building.";

/// A parsed command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Args {
    /// The kernel crate's folder.
    pub crate_dir: PathBuf,
    /// `--arch` (default `sm_90`).
    pub arch: Arch,
    /// `--ptx-isa` (default 8.0 for `sm_90`, 8.3 for `sm_90a`).
    pub ptx_isa: PtxIsa,
    /// `--features`.
    pub features: Vec<String>,
    /// `--out-dir`.
    pub out_dir: Option<PathBuf>,
    /// `--target-dir`.
    pub target_dir: Option<PathBuf>,
    /// `--allow-ptxas-warnings`.
    pub allow_ptxas_warnings: bool,
    /// `--clippy`: run the device clippy over the crate instead of building it
    /// ([`PtxBuilder::clippy`]).
    pub clippy: bool,
}

/// Parses the arguments after the program name.
///
/// # Errors
/// A message naming the bad argument and what is allowed (with the usage text).
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Args, String> {
    let bad = |m: String| format!("{m}\n{USAGE}");
    let mut it = args.into_iter();
    let mut crate_dir = None;
    let mut arch = Arch::Sm90;
    let mut isa = None;
    let mut features = Vec::new();
    let (mut out_dir, mut target_dir, mut allow, mut clippy) = (None, None, false, false);
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| bad(format!("{name} needs a value")))
        };
        match a.as_str() {
            "--arch" => {
                arch = match value("--arch")?.as_str() {
                    "sm_90" => Arch::Sm90,
                    "sm_90a" => Arch::Sm90a,
                    v => return Err(bad(format!("--arch {v}: allowed are sm_90 and sm_90a"))),
                }
            }
            "--ptx-isa" => {
                let v = value("--ptx-isa")?;
                let parsed = v
                    .split_once('.')
                    .and_then(|(a, b)| Some(PtxIsa::new(a.parse().ok()?, b.parse().ok()?)))
                    .filter(|i| i.minor <= 9);
                isa =
                    Some(parsed.ok_or_else(|| {
                        bad(format!("--ptx-isa {v}: want MAJOR.MINOR, e.g. 8.3"))
                    })?);
            }
            "--features" => features.extend(
                value("--features")?
                    .split(',')
                    .filter(|f| !f.is_empty())
                    .map(String::from),
            ),
            "--out-dir" => out_dir = Some(PathBuf::from(value("--out-dir")?)),
            "--target-dir" => target_dir = Some(PathBuf::from(value("--target-dir")?)),
            "--allow-ptxas-warnings" => allow = true,
            "--clippy" => clippy = true,
            "-h" | "--help" => return Err(USAGE.to_string()),
            s if s.starts_with('-') => return Err(bad(format!("unknown option {s}"))),
            s if crate_dir.is_none() => crate_dir = Some(PathBuf::from(s)),
            s => {
                return Err(bad(format!(
                    "one kernel crate at a time; {s} is one too many"
                )))
            }
        }
    }
    let crate_dir = crate_dir.ok_or_else(|| bad("no kernel crate folder given".into()))?;
    let ptx_isa = isa.unwrap_or(match arch {
        Arch::Sm90 => PtxIsa::V8_0,
        Arch::Sm90a => PtxIsa::V8_3,
    });
    Ok(Args {
        crate_dir,
        arch,
        ptx_isa,
        features,
        out_dir,
        target_dir,
        allow_ptxas_warnings: allow,
        clippy,
    })
}

/// The builder a command line asks for.
pub fn builder(args: &Args) -> PtxBuilder {
    let mut b = PtxBuilder::new(&args.crate_dir)
        .arch(args.arch)
        .ptx_isa(args.ptx_isa)
        .features(args.features.iter().cloned())
        .deny_ptxas_warnings(!args.allow_ptxas_warnings);
    if let Some(d) = &args.out_dir {
        b = b.out_dir(d);
    }
    if let Some(d) = &args.target_dir {
        b = b.target_dir(d);
    }
    b
}

/// Parses, builds and prints the report (stdout).
///
/// # Errors
/// The usage or build error's message.
pub fn run<I: IntoIterator<Item = String>>(args: I) -> Result<(), String> {
    let args = parse(args)?;
    if args.clippy {
        builder(&args).clippy().map_err(|e| e.to_string())?;
        println!("device clippy: clean (-D warnings)");
        return Ok(());
    }
    let built = builder(&args).build().map_err(|e| e.to_string())?;
    println!("wrote {}", built.path.display());
    println!("kernels: {}", built.entries.join(", "));
    println!("device rustc: {}", built.rustc_version);
    match (&built.resources, &built.ptxas_release) {
        (Some(r), release) => {
            println!(
                "ptxas {}:",
                release.as_deref().unwrap_or("(unknown release)")
            );
            print!("{}", ptxas::table(args.arch, r));
        }
        (None, _) => println!("ptxas not found: module not assembled (run `cargo xtask setup`)"),
    }
    for d in &built.ptxas_diagnostics {
        println!(
            "{}{}",
            if d.is_harmful() { "harmful: " } else { "" },
            d.text
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Args, String> {
        parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn issue22_item03_command_line_is_parsed() {
        let a = p(&["k"]).unwrap();
        assert_eq!(
            (a.arch, a.ptx_isa, a.allow_ptxas_warnings),
            (Arch::Sm90, PtxIsa::V8_0, false)
        );
        let a = p(&[
            "--arch",
            "sm_90a",
            "k",
            "--features",
            "x,y",
            "--allow-ptxas-warnings",
            "--out-dir",
            "o",
        ])
        .unwrap();
        assert_eq!(a.ptx_isa, PtxIsa::V8_3);
        assert_eq!(a.features, ["x", "y"]);
        assert!(a.allow_ptxas_warnings);
        assert!(!a.clippy);
        assert!(p(&["k", "--clippy"]).unwrap().clippy);
        assert_eq!(a.out_dir, Some(PathBuf::from("o")));
        assert_eq!(
            p(&["k", "--ptx-isa", "8.4"]).unwrap().ptx_isa,
            PtxIsa::new(8, 4)
        );
        for (bad, says) in [
            (
                &["--arch", "sm_80", "k"][..],
                "allowed are sm_90 and sm_90a",
            ),
            (&[][..], "no kernel crate"),
            (&["k", "l"][..], "one too many"),
            (&["k", "--ptx-isa", "eight"][..], "MAJOR.MINOR"),
            (&["k", "--bogus"][..], "unknown option --bogus"),
            (&["k", "--out-dir"][..], "needs a value"),
        ] {
            let e = p(bad).unwrap_err();
            assert!(e.contains(says) && e.contains("usage:"), "{bad:?}: {e}");
        }
    }
}
