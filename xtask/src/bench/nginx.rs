//! nginx from Debian's packages as the benchmark server: one worker, tiny
//! responses, HTTP and HTTPS (TLS 1.3, self-signed) on loopback.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};

use super::proc::{children, wait_until};
use crate::run_checked;

pub const HTTP_PORT: u16 = 18080;
pub const HTTPS_PORT: u16 = 18443;
/// HTTP/2 over TLS (ALPN h2), for h2load.
pub const H2_PORT: u16 = 18444;

pub struct Nginx {
    child: Child,
    pub dir: PathBuf,
}

impl Nginx {
    pub fn start() -> Result<Nginx> {
        let dir = std::env::temp_dir().join(format!("observer-bench-nginx-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        run_checked(
            Command::new("openssl")
                .args([
                    "req",
                    "-x509",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:P-256",
                ])
                .args(["-nodes", "-days", "2", "-subj", "/CN=localhost"])
                .arg("-keyout")
                .arg(dir.join("key.pem"))
                .arg("-out")
                .arg(dir.join("cert.pem"))
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .context("making a self-signed certificate (openssl)")?;
        let d = dir.display();
        let conf = format!(
            "worker_processes 1;\n\
             worker_rlimit_nofile 200000;\n\
             daemon off;\n\
             master_process on;\n\
             user root;\n\
             pid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\n\
             events {{ worker_connections 100000; }}\n\
             http {{\n\
               access_log off;\n\
               keepalive_requests 10000000;\n\
               keepalive_timeout 300s;\n\
               client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;\n\
               uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;\n\
               server {{\n\
                 listen 127.0.0.1:{HTTP_PORT} backlog=4096;\n\
                 listen 127.0.0.1:{HTTPS_PORT} ssl backlog=4096;\n\
                 listen 127.0.0.1:{H2_PORT} ssl http2 backlog=4096;\n\
                 ssl_certificate {d}/cert.pem;\n\
                 ssl_certificate_key {d}/key.pem;\n\
                 ssl_protocols TLSv1.3;\n\
                 location / {{ return 200 \"ok\\n\"; }}\n\
               }}\n\
             }}\n"
        );
        std::fs::create_dir_all(dir.join("tmp"))?;
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf)?;
        let child = Command::new("nginx")
            .arg("-c")
            .arg(&conf_path)
            .arg("-p")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting nginx")?;
        let nginx = Nginx { child, dir };
        let up = wait_until(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", HTTP_PORT)).is_ok()
                && nginx.worker().is_some()
        });
        if !up {
            let log = std::fs::read_to_string(nginx.dir.join("error.log")).unwrap_or_default();
            bail!("nginx did not start: {log}");
        }
        Ok(nginx)
    }

    /// The single worker process, whose CPU time is the server's cost.
    pub fn worker(&self) -> Option<u32> {
        children(self.child.id()).into_iter().next()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGQUIT) };
        let _ = wait_until(Duration::from_secs(5), || {
            matches!(self.child.try_wait(), Ok(Some(_)))
        });
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
