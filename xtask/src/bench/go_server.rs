//! The Go HTTPS server (bench/go_server), for the observer's cost on Go's
//! own crypto/tls: Go programs carry TLS compiled in, so they are probed in
//! the executable rather than in libssl, at a cost of their own.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};

use super::proc::wait_until;

/// HTTP/1.1 over TLS 1.3, beside nginx's ports.
pub const GO_HTTPS_PORT: u16 = 18445;

/// Builds bench/go_server/main.go into target/bench/go_server with Debian's
/// Go (1.19): the standard library only, so no module, no proxy and none of
/// the user's settings; the build cache stays under target/ (a rebuild takes
/// a second).
pub fn build(root: &Path) -> Result<PathBuf> {
    let dir = root.join("target/bench");
    let bin = dir.join("go_server");
    let out = Command::new("go")
        .arg("build")
        .arg("-o")
        .arg(&bin)
        .arg(root.join("bench/go_server/main.go"))
        .env("GO111MODULE", "off")
        .env("GOENV", "off")
        .env("GOFLAGS", "")
        .env("GOCACHE", dir.join("go-cache"))
        .env("GOPATH", dir.join("go-path"))
        .output()
        .context(
            "go_https_keepalive needs Go to build bench/go_server: `go` did not run \
             (install Debian's golang-go)",
        )?;
    if !out.status.success() {
        bail!(
            "go build bench/go_server/main.go: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(bin)
}

/// The running server; killed on drop. One process (GOMAXPROCS as Go sets
/// it), so its CPU time is the server's whole cost.
pub struct GoServer {
    child: Child,
    log: PathBuf,
}

impl GoServer {
    /// Starts `bin` with the certificate and key in `cert_dir` (nginx's, so
    /// both servers present the same P-256 certificate).
    pub fn start(bin: &Path, cert_dir: &Path) -> Result<GoServer> {
        let log = cert_dir.join("go_server.log");
        let child = Command::new(bin)
            .args(["-port", &GO_HTTPS_PORT.to_string()])
            .arg("-cert")
            .arg(cert_dir.join("cert.pem"))
            .arg("-key")
            .arg(cert_dir.join("key.pem"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting bench/go_server")?;
        let mut server = GoServer { child, log };
        let up = wait_until(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", GO_HTTPS_PORT)).is_ok()
        });
        if !up || !matches!(server.child.try_wait(), Ok(None)) {
            let log = std::fs::read_to_string(&server.log).unwrap_or_default();
            bail!("the Go server did not start: {log}");
        }
        Ok(server)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for GoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}
