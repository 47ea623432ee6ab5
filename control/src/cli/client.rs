//! How the commands ask an agent (or Prometheus, or another agent in `fleet status`) over
//! HTTP: bounded in time and in the size of the answer, so a hung or hostile endpoint cannot
//! hold or exhaust the command.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};

/// A whole GET, the body included.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// A whole POST (`reload`, `policy rollback`): the agent answers once the policy is applied,
/// which takes seconds for the largest policies.
pub const APPLY_TIMEOUT: Duration = Duration::from_secs(120);
/// Connecting (a local agent answers at once).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest answer read by default: the status document holds the policy's levels, classes
/// and counters, far below this.
pub const MAX_ANSWER: usize = 64 << 20;

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .http_status_as_error(false)
        .build()
        .new_agent()
}

/// Reads `resp`'s body as text, refusing a body over `limit` bytes.
fn body(mut resp: ureq::http::Response<ureq::Body>, url: &str, limit: usize) -> Result<(u16, String)> {
    let code = resp.status().as_u16();
    // One byte over the limit tells "too large" from "exactly the limit".
    let body = resp
        .body_mut()
        .with_config()
        .limit(limit as u64 + 1)
        .read_to_string();
    let body = match body {
        Ok(b) => b,
        Err(ureq::Error::BodyExceedsLimit(_)) => bail!("{url}: the answer is larger than {limit} bytes"),
        Err(e) => return Err(e).with_context(|| format!("reading the answer from {url}")),
    };
    if body.len() > limit {
        bail!("{url}: the answer is larger than {limit} bytes");
    }
    Ok((code, body))
}

/// The `Authorization` header's value for a bearer token.
fn bearer_header(token: &str) -> String {
    format!("Bearer {token}")
}

/// GETs `url`: (HTTP status, body), refusing a body over `limit` bytes.
pub fn get(url: &str, limit: usize) -> Result<(u16, String)> {
    get_as(url, limit, None)
}

/// [`get`] with the agent's API token (`--api-token-file`), when there is one.
pub fn get_as(url: &str, limit: usize, token: Option<&str>) -> Result<(u16, String)> {
    get_within(url, limit, token, TIMEOUT)
}

/// [`get_as`] bounded by `timeout` for the whole answer.
fn get_within(url: &str, limit: usize, token: Option<&str>, timeout: Duration) -> Result<(u16, String)> {
    let mut req = agent(timeout).get(url);
    if let Some(t) = token {
        req = req.header("Authorization", bearer_header(t));
    }
    let resp = req.call().with_context(|| format!("asking {url}"))?;
    body(resp, url, limit)
}

/// How long a stream (`paceline trace`) may go without a byte: the agent sends a heartbeat
/// every second.
pub const STREAM_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// GETs `url` and hands each line of the answer to `line` as it arrives, until the answer
/// ends or `line` returns false. A status other than 200 returns (status, body) unread.
pub fn get_lines(
    url: &str,
    token: Option<&str>,
    mut line: impl FnMut(&str) -> bool,
) -> Result<(u16, String)> {
    use std::io::BufRead as _;
    let a = ureq::Agent::config_builder()
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_recv_response(Some(TIMEOUT))
        .timeout_per_read(Some(STREAM_READ_TIMEOUT))
        .http_status_as_error(false)
        .build()
        .new_agent();
    let mut req = a.get(url);
    if let Some(t) = token {
        req = req.header("Authorization", bearer_header(t));
    }
    let mut resp = req.call().with_context(|| format!("asking {url}"))?;
    if resp.status().as_u16() != 200 {
        return body(resp, url, MAX_ANSWER);
    }
    let r = std::io::BufReader::new(resp.body_mut().as_reader());
    for l in r.lines() {
        let l = l.with_context(|| format!("reading the answer from {url}"))?;
        if !line(&l) {
            break;
        }
    }
    Ok((200, String::new()))
}

/// POSTs an empty body to `url`: (HTTP status, body), refusing a body over `limit` bytes.
pub fn post(url: &str, limit: usize, token: Option<&str>) -> Result<(u16, String)> {
    let mut req = agent(APPLY_TIMEOUT).post(url);
    if let Some(t) = token {
        req = req.header("Authorization", bearer_header(t));
    }
    let resp = req.send_empty().with_context(|| format!("asking {url}"))?;
    body(resp, url, limit)
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};
    use std::net::TcpListener;
    use std::time::Instant;

    use super::*;

    /// A one-connection server that answers with `head` and then `body_len` bytes, or hangs.
    fn serve(head: &'static str, body_len: usize, hang: bool) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            if hang {
                std::thread::sleep(Duration::from_secs(5));
                return;
            }
            let _ = s.write_all(head.as_bytes());
            let chunk = vec![b'a'; 64 * 1024];
            let mut left = body_len;
            while left > 0 {
                let n = left.min(chunk.len());
                if s.write_all(&chunk[..n]).is_err() {
                    return;
                }
                left -= n;
            }
        });
        format!("http://{addr}/policy")
    }

    #[test]
    fn a_body_over_the_limit_is_refused() {
        let url = serve("HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n", 3 << 20, false);
        let e = get(&url, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("larger than 1048576 bytes"), "{e}");
        let url = serve("HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n", 1000, false);
        assert_eq!(get(&url, 1000).unwrap().1.len(), 1000);
    }

    #[test]
    fn a_hung_agent_times_out() {
        // The bound `get` uses (`TIMEOUT`, 10 s) passed as 1 s, so the test takes a second.
        let url = serve("", 0, true);
        let t = Instant::now();
        assert!(get_within(&url, 1000, None, Duration::from_secs(1)).is_err());
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    }
}
