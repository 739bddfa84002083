//! Watches: each kind's reflector keeps its objects in memory and wakes the controller's loop
//! at every change (the Services', the EndpointSlices' and the pools', and the Gateway API's).

use crate::metrics::Metrics;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::utils::Backoff;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// An object's creationTimestamp as text (RFC 3339: sorts as time; empty when unset).
pub fn created(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    m.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default()
}

/// Seconds a watch lasts before the server ends it and it starts again (under the client's
/// read deadline, [`READ_DEADLINE`]): with the deadline, the longest a watch can stall unseen.
pub const WATCH_SECONDS: u32 = 20;
/// The client's deadline for any read (a watch's next bytes included): a connection that
/// stopped answering is closed and the watch listed again.
pub const READ_DEADLINE: std::time::Duration = std::time::Duration::from_secs(WATCH_SECONDS as u64 + 10);

/// A watch's retries after an error: 250 ms doubling to at most 2 s, from the start again
/// after any event. (kube's default grows to 30 s and starts again only after 120 s without an
/// error: after two kube-apiserver restarts in a row, changes waited half a minute.)
struct Retry(Duration);

impl Default for Retry {
    fn default() -> Retry {
        Retry(FIRST_RETRY)
    }
}

const FIRST_RETRY: Duration = Duration::from_millis(250);
const LAST_RETRY: Duration = Duration::from_secs(2);

impl Iterator for Retry {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let d = self.0;
        self.0 = (self.0 * 2).min(LAST_RETRY);
        Some(d)
    }
}

impl Backoff for Retry {
    fn reset(&mut self) {
        self.0 = FIRST_RETRY;
    }
}

/// Keeps `w` filled from a watch of `api`, waking `notify` at every event; retries with
/// [`Retry`], and lists again whenever `metrics.watches` restarts.
pub fn spawn_reflector<K>(mut w: reflector::store::Writer<K>, api: Api<K>, wc: watcher::Config, notify: Arc<Notify>, metrics: Arc<Metrics>)
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let mut restart = metrics.watches.subscribe();
    tokio::spawn(async move {
        loop {
            let stream = watcher(api.clone(), wc.clone()).backoff(Retry::default());
            futures::pin_mut!(stream);
            loop {
                tokio::select! {
                    ev = stream.next() => match ev {
                        Some(Ok(ev)) => {
                            w.apply_watcher_event(&ev);
                            notify.notify_one();
                        }
                        Some(Err(e)) => {
                            metrics.watch_error();
                            tracing::warn!(kind = %K::kind(&()), error = %e, "watch failed; retrying");
                        }
                        None => break,
                    },
                    r = restart.changed() => {
                        if r.is_err() {
                            return;
                        }
                        break;
                    }
                }
            }
        }
    });
}
