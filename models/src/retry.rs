//! Bounded retries for the HTTP clients (retriever, OpenAI-compatible policies): one loop, so
//! both back off and report the same way.
//!
//! Pauses double from a first pause up to [`MAX_PAUSE`], and each is jittered (a random part
//! of it is dropped), so that the many requests a stage has in flight, failing together
//! against an overloaded server, do not come back together. A server that says when to come
//! back (`Retry-After` on a 429 or 503) is believed, up to [`MAX_PAUSE`].

use std::future::Future;
use std::time::{Duration, SystemTime};

use rand::Rng;

/// The longest pause between two attempts, whatever the doubling or a server asks for.
pub const MAX_PAUSE: Duration = Duration::from_secs(60);

/// What to do after a failed attempt.
pub enum Attempt {
    /// A passing failure (connection, timeout, 429, 5xx): try again, after the server's
    /// `Retry-After` when it gave one.
    Retry {
        /// What failed.
        message: String,
        /// The server's `Retry-After`, when it gave one.
        after: Option<Duration>,
    },
    /// A failure that will not go away by retrying.
    GiveUp(String),
}

impl Attempt {
    /// A passing failure with no word from the server on when to retry.
    pub fn retry(message: impl Into<String>) -> Attempt {
        Attempt::Retry { message: message.into(), after: None }
    }

    /// Reads an HTTP answer: a 429 or 5xx is a passing failure (with its `Retry-After`),
    /// another non-success status is final, and success is `None`.
    pub fn from_status(response: &reqwest::Response, message: impl FnOnce() -> String) -> Option<Attempt> {
        let status = response.status();
        if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            let after = response.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok());
            return Some(Attempt::Retry { message: message(), after: after.and_then(retry_after) });
        }
        None
    }
}

/// A `Retry-After` value: seconds, or an HTTP date (a date already past means now).
fn retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO))
}

/// The pause before the next attempt: the server's `Retry-After` plus up to a quarter more
/// (so that its clients spread out), else between half and all of the doubling `pause`;
/// never more than [`MAX_PAUSE`].
fn pause_before_retry(pause: Duration, after: Option<Duration>, rng: &mut impl Rng) -> Duration {
    let pause = match after {
        Some(after) => after + after.mul_f64(rng.random_range(0.0..0.25)),
        None => pause.mul_f64(rng.random_range(0.5..=1.0)),
    };
    pause.min(MAX_PAUSE)
}

/// Runs `attempt` until it succeeds, gives up, or has been retried `retries` times, pausing
/// about `first_pause`, then twice as long each time (see the module's doc). The error says
/// how many attempts were made.
pub async fn with_retries<T, F, Fut>(
    retries: u32,
    first_pause: Duration,
    who: &str,
    mut attempt: F,
) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Attempt>>,
{
    let mut pause = first_pause.min(MAX_PAUSE);
    let mut attempts = 0;
    loop {
        attempts += 1;
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(Attempt::Retry { message, after }) if attempts <= retries => {
                let wait = pause_before_retry(pause, after, &mut rand::rng());
                tracing::warn!(who, attempt = attempts, wait_ms = wait.as_millis() as u64, "{message}; retrying");
                tokio::time::sleep(wait).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
            Err(Attempt::Retry { message, .. }) | Err(Attempt::GiveUp(message)) => {
                return Err(if attempts > 1 { format!("{message} (after {attempts} attempts)") } else { message });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn pauses_are_jittered_and_capped() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let pause = Duration::from_millis(800);
        let pauses: Vec<Duration> = (0..64).map(|_| pause_before_retry(pause, None, &mut rng)).collect();
        assert!(pauses.iter().all(|p| (pause / 2..=pause).contains(p)), "{pauses:?}");
        let distinct: std::collections::BTreeSet<Duration> = pauses.iter().copied().collect();
        assert!(distinct.len() > 32, "64 clients must not retry in lockstep: {distinct:?}");
        assert_eq!(pause_before_retry(Duration::from_secs(3600), None, &mut rng), MAX_PAUSE);
        let told = Duration::from_secs(2);
        let after = pause_before_retry(Duration::from_millis(10), Some(told), &mut rng);
        assert!((told..told + told / 4).contains(&after), "{after:?}");
        assert_eq!(pause_before_retry(pause, Some(Duration::from_secs(86_400)), &mut rng), MAX_PAUSE);
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        assert_eq!(retry_after(" 7 "), Some(Duration::from_secs(7)));
        let soon = SystemTime::now() + Duration::from_secs(30);
        let parsed = retry_after(&httpdate::fmt_http_date(soon)).unwrap();
        assert!((Duration::from_secs(28)..=Duration::from_secs(30)).contains(&parsed), "{parsed:?}");
        assert_eq!(retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), Some(Duration::ZERO));
        assert_eq!(retry_after("soon"), None);
    }
}
