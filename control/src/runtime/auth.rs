//! Who may use the API: a bearer token in a file (`--api-token-file`).
//!
//! Every API request that reads the policy, the flows or the event log, or changes state,
//! carries `Authorization: Bearer <token>`; `/metrics`, `/healthz` and `/readyz` stay open (a
//! scraper and a kubelet probe have no token). The file is read again for each request, so
//! replacing it rotates the token without a restart; a file that cannot be read then refuses
//! every request (503) rather than letting any through. Without a token file the API listens
//! on loopback only: [`check_listen`] refuses any other `--api-addr` at start.
//!
//! The comparison is of SHA-256 digests (`paceline_policy::hash`), so its time does not depend on how much of a guess
//! matches.

use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Result, bail};

/// The shortest token accepted: 16 characters (128 bits as hex, more as base64).
pub const MIN_TOKEN_LEN: usize = 16;
/// The largest token file read.
pub const MAX_TOKEN_FILE: u64 = 4096;

/// Refuses an API address other than loopback when no token guards it (the API reveals the
/// policy and flows and can reload and roll back).
pub fn check_listen(api_addr: SocketAddr, token_file: Option<&Path>) -> Result<()> {
    if token_file.is_none() && !api_addr.ip().is_loopback() {
        bail!(
            "--api-addr {api_addr} is not a loopback address and no --api-token-file guards it: \
             anyone who reaches it could read the policy and roll it back. Give \
             --api-token-file FILE (a token of at least {MIN_TOKEN_LEN} characters, mode 0600), \
             or an --api-addr on 127.0.0.1 or ::1"
        );
    }
    Ok(())
}

/// Reads a token file as the agent does: a regular file (symlinks followed, as a Kubernetes
/// Secret's are), owned by root or by this process's user, readable by no one else (mode
/// 0600 or 0400), one token of at least [`MIN_TOKEN_LEN`] visible ASCII characters (trailing
/// whitespace and newlines ignored).
pub fn read_token_file(path: &Path) -> Result<String> {
    let shown = path.display();
    let md = std::fs::metadata(path).map_err(|e| anyhow::anyhow!("the API token file {shown}: {e}"))?;
    if !md.is_file() {
        bail!("the API token file {shown} is not a regular file");
    }
    let mode = md.mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!(
            "the API token file {shown} has mode {mode:04o}: group and others must not read it \
             (chmod 600 {shown})"
        );
    }
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if md.uid() != 0 && md.uid() != euid {
        bail!(
            "the API token file {shown} is owned by uid {}: it must be root's or this user's \
             (uid {euid})",
            md.uid()
        );
    }
    if md.len() > MAX_TOKEN_FILE {
        bail!(
            "the API token file {shown} is {} bytes: at most {MAX_TOKEN_FILE}",
            md.len()
        );
    }
    let raw = std::fs::read(path).map_err(|e| anyhow::anyhow!("reading the API token file {shown}: {e}"))?;
    parse_token(&raw).map_err(|e| anyhow::anyhow!("the API token file {shown}: {e}"))
}

/// The token in a file's bytes: trailing whitespace dropped, the rest visible ASCII.
pub fn parse_token(raw: &[u8]) -> Result<String> {
    let Ok(text) = std::str::from_utf8(raw) else {
        bail!("not text: the token must be visible ASCII");
    };
    let t = text.trim_end();
    if t.len() < MIN_TOKEN_LEN {
        bail!(
            "the token is {} characters: at least {MIN_TOKEN_LEN} (e.g. `openssl rand -hex 32`)",
            t.len()
        );
    }
    if let Some(c) = t.chars().find(|c| !c.is_ascii_graphic()) {
        bail!("the token holds {c:?}: only visible ASCII, no spaces or line breaks inside");
    }
    Ok(t.to_string())
}

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A token that is not the file's.
    Wrong,
}

/// The API's guard: the token file and the count of refused requests.
#[derive(Debug)]
pub struct ApiAuth {
    path: PathBuf,
    missing: AtomicU64,
    wrong: AtomicU64,
}

impl ApiAuth {
    /// Checks the file at start (so a bad one fails the start, naming it).
    pub fn open(path: &Path) -> Result<ApiAuth> {
        read_token_file(path)?;
        Ok(ApiAuth {
            path: path.to_path_buf(),
            missing: AtomicU64::new(0),
            wrong: AtomicU64::new(0),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks an `Authorization` header's value against the file as it is now: `Ok(Ok(()))`
    /// let through, `Ok(Err(r))` refused (and counted), `Err` the file cannot be read.
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<Result<(), Refusal>> {
        let token = read_token_file(&self.path)?;
        let given = authorization.and_then(|h| {
            let h = std::str::from_utf8(h).ok()?.trim();
            let (scheme, rest) = h.split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| rest.trim().to_string())
        });
        let verdict = match given {
            None => Err(Refusal::Missing),
            Some(g) if paceline_policy::hash(g.as_bytes()) == paceline_policy::hash(token.as_bytes()) => {
                Ok(())
            }
            Some(_) => Err(Refusal::Wrong),
        };
        match verdict {
            Err(Refusal::Missing) => self.missing.fetch_add(1, Ordering::Relaxed),
            Err(Refusal::Wrong) => self.wrong.fetch_add(1, Ordering::Relaxed),
            Ok(()) => 0,
        };
        Ok(verdict)
    }

    /// Requests refused so far: (no token, a wrong token).
    pub fn refused(&self) -> (u64, u64) {
        (
            self.missing.load(Ordering::Relaxed),
            self.wrong.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn file(name: &str, text: &str, mode: u32) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("paceline-auth-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("token");
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn a_token_file_must_be_private_long_enough_and_visible_ascii() {
        let good = file("good", "0123456789abcdef0123\n", 0o600);
        assert_eq!(read_token_file(&good).unwrap(), "0123456789abcdef0123");
        let open = file("open", "0123456789abcdef0123\n", 0o644);
        let e = read_token_file(&open).unwrap_err().to_string();
        assert!(e.contains("mode 0644") && e.contains("chmod 600"), "{e}");
        let short = file("short", "abc\n", 0o600);
        let e = read_token_file(&short).unwrap_err().to_string();
        assert!(e.contains("3 characters") && e.contains("at least 16"), "{e}");
        let spaced = file("spaced", "0123456789 abcdef0123", 0o400);
        assert!(read_token_file(&spaced).unwrap_err().to_string().contains("' '"));
        let e = read_token_file(Path::new("/nonexistent/token"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/token"), "{e}");
        for p in [good, open, short, spaced] {
            let _ = std::fs::remove_dir_all(p.parent().unwrap());
        }
    }

    #[test]
    fn only_the_files_token_passes_and_refusals_are_counted_by_reason() {
        let p = file("check", "0123456789abcdef0123\n", 0o600);
        let a = ApiAuth::open(&p).unwrap();
        assert_eq!(a.check(Some(b"Bearer 0123456789abcdef0123")).unwrap(), Ok(()));
        assert_eq!(a.check(Some(b"bearer  0123456789abcdef0123 ")).unwrap(), Ok(()));
        assert_eq!(a.check(None).unwrap(), Err(Refusal::Missing));
        assert_eq!(
            a.check(Some(b"Basic dXNlcjpwYXNz")).unwrap(),
            Err(Refusal::Missing)
        );
        assert_eq!(
            a.check(Some(b"Bearer 0123456789abcdef012")).unwrap(),
            Err(Refusal::Wrong)
        );
        assert_eq!(a.refused(), (2, 1));
        // Rotation: the file is read again for each request.
        std::fs::write(&p, "fedcba9876543210fedc").unwrap();
        assert_eq!(
            a.check(Some(b"Bearer 0123456789abcdef0123")).unwrap(),
            Err(Refusal::Wrong)
        );
        assert_eq!(a.check(Some(b"Bearer fedcba9876543210fedc")).unwrap(), Ok(()));
        // A file that cannot be read refuses everything.
        std::fs::remove_file(&p).unwrap();
        assert!(a.check(Some(b"Bearer fedcba9876543210fedc")).is_err());
        let _ = std::fs::remove_dir_all(p.parent().unwrap());
    }

    #[test]
    fn without_a_token_the_api_listens_on_loopback_only() {
        assert!(check_listen("127.0.0.1:9978".parse().unwrap(), None).is_ok());
        assert!(check_listen("[::1]:9978".parse().unwrap(), None).is_ok());
        let e = check_listen("10.0.0.1:9978".parse().unwrap(), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--api-addr 10.0.0.1:9978") && e.contains("--api-token-file"),
            "{e}"
        );
        assert!(check_listen("0.0.0.0:9978".parse().unwrap(), None).is_err());
        assert!(check_listen("10.0.0.1:9978".parse().unwrap(), Some(Path::new("/t"))).is_ok());
    }
}
