//! Bounded retries with doubling pauses, for the HTTP clients (retriever, OpenAI-compatible
//! policies): one loop, so both back off and report the same way.

use std::future::Future;
use std::time::Duration;

/// What to do after a failed attempt.
pub(crate) enum Attempt {
    /// A passing failure (connection, timeout, 429, 5xx): try again.
    Retry(String),
    /// A failure that will not go away by retrying.
    GiveUp(String),
}

/// Runs `attempt` until it succeeds, gives up, or has been retried `retries` times, pausing
/// `first_pause`, then twice as long each time. The error says how many attempts were made.
pub(crate) async fn with_retries<T, F, Fut>(
    retries: u32,
    first_pause: Duration,
    who: &str,
    mut attempt: F,
) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Attempt>>,
{
    let mut pause = first_pause;
    let mut attempts = 0;
    loop {
        attempts += 1;
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(Attempt::Retry(message)) if attempts <= retries => {
                tracing::warn!(who, attempt = attempts, "{message}; retrying");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            Err(Attempt::Retry(message)) | Err(Attempt::GiveUp(message)) => {
                return Err(if attempts > 1 { format!("{message} (after {attempts} attempts)") } else { message });
            }
        }
    }
}
