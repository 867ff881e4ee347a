//! A request path as metrics may group it: id-like segments (numbers, hex
//! digests and UUIDs, long opaque tokens) become `{id}`, so a path per user,
//! object or session does not make a series of its own.

/// Segments kept; the rest of a deeper path is `{rest}`.
const MAX_SEGMENTS: usize = 6;

/// `path` (no query) with its id-like segments replaced by `{id}`.
pub fn template(path: &str) -> String {
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let mut out = String::new();
    for (n, seg) in path.split('/').skip(1).enumerate() {
        out.push('/');
        if n == MAX_SEGMENTS {
            out.push_str("{rest}");
            break;
        }
        out.push_str(if id_like(seg) { "{id}" } else { seg });
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

fn id_like(seg: &str) -> bool {
    let b = seg.as_bytes();
    let digits = b.iter().filter(|c| c.is_ascii_digit()).count();
    !b.is_empty()
        && (digits == b.len()
            || (b.len() >= 8 && b.iter().all(|c| c.is_ascii_hexdigit() || *c == b'-'))
            || (b.len() >= 16 && digits > 0)
            || b.len() > 40
            || b.contains(&b'%'))
}

#[cfg(test)]
mod tests {
    use super::template;

    #[test]
    fn api_paths_stay_ids_go() {
        for (path, want) in [
            ("/v1/chat/completions", "/v1/chat/completions"),
            ("/api/generate", "/api/generate"),
            ("/", "/"),
            ("", "/"),
            ("/users/12345/orders", "/users/{id}/orders"),
            (
                "/v1/threads/3f2b9c1e-8d7a-4e21-9c3b-1a2b3c4d5e6f/runs",
                "/v1/threads/{id}/runs",
            ),
            ("/blobs/sha256:deadbeef", "/blobs/sha256:deadbeef"),
            ("/blobs/deadbeefcafe0123", "/blobs/{id}"),
            ("/v1/files/file-abc123XYZ789def456", "/v1/files/{id}"),
            ("/search/caf%C3%A9", "/search/{id}"),
            ("/a/b/c/d/e/f/g/h", "/a/b/c/d/e/f/{rest}"),
            ("/v1/models?limit=5", "/v1/models"),
            ("/static/app.js", "/static/app.js"),
        ] {
            assert_eq!(template(path), want, "{path}");
        }
    }
}
