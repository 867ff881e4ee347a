//! A tmux server of a test's own, to drive `observer top` in a real
//! terminal: keys sent with `send-keys`, the screen read with
//! `capture-pane`.

use std::{
    collections::HashMap,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// A tmux server of the test's own (its own socket), killed on drop.
pub struct Tmux {
    socket: String,
    pub dir: PathBuf,
}

impl Tmux {
    /// `shell` runs in an 80x24 pane (no status line), in [`Tmux::dir`].
    pub fn start(shell: &str) -> Tmux {
        let socket = format!("observer-top-{}", std::process::id());
        let dir = std::env::temp_dir().join(&socket);
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("tmux.conf");
        std::fs::write(&conf, "set -g status off\nset -g escape-time 0\n").unwrap();
        let t = Tmux { socket, dir };
        let ok = t
            .cmd()
            .arg("-f")
            .arg(&conf)
            .args([
                "new-session",
                "-d",
                "-x",
                "80",
                "-y",
                "24",
                "-s",
                "top",
                "-c",
            ])
            .arg(&t.dir)
            .arg(shell)
            .status()
            .unwrap();
        assert!(ok.success(), "tmux new-session failed");
        t
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket]).env_remove("TMUX");
        c
    }

    pub fn output(&self, args: &[&str]) -> String {
        let out = self
            .cmd()
            .args(args)
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        assert!(out.status.success(), "tmux {args:?} failed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The pane's visible lines, wrapped lines joined.
    pub fn screen(&self) -> Vec<String> {
        self.output(&["capture-pane", "-p", "-J", "-t", "top"])
            .lines()
            .map(|l| l.trim_end().to_owned())
            .collect()
    }

    pub fn display(&self, format: &str) -> String {
        self.output(&["display-message", "-p", "-t", "top", format])
            .trim()
            .to_owned()
    }

    /// Types `text` as it is.
    pub fn type_text(&self, text: &str) {
        self.output(&["send-keys", "-t", "top", "-l", text]);
    }

    /// A named key (Enter, Escape).
    pub fn key(&self, name: &str) {
        self.output(&["send-keys", "-t", "top", name]);
    }

    /// The screen once `ok` holds (panics with the screen after `secs`).
    pub fn wait(&self, what: &str, secs: u64, ok: impl Fn(&[String]) -> bool) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.screen();
            if ok(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {secs} s; the screen:\n{}",
                s.join("\n")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The table's rows as header name -> cell (cells never hold spaces here).
pub fn table(screen: &[String]) -> Vec<HashMap<String, String>> {
    let Some(h) = screen.iter().position(|l| {
        let t = l.trim_start();
        t.starts_with("PID") || t.starts_with("ENDPOINT")
    }) else {
        return Vec::new();
    };
    let header: Vec<&str> = screen[h].split_whitespace().collect();
    screen[h + 1..]
        .iter()
        .take_while(|l| !l.trim().is_empty())
        .map(|l| {
            header
                .iter()
                .zip(l.split_whitespace())
                .map(|(k, v)| ((*k).to_owned(), v.to_owned()))
                .collect()
        })
        .collect()
}

pub fn row_of<'a>(
    rows: &'a [HashMap<String, String>],
    col: &str,
    v: &str,
) -> Option<&'a HashMap<String, String>> {
    rows.iter().find(|r| r.get(col).is_some_and(|x| x == v))
}
