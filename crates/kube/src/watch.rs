//! Watches: each kind's reflector keeps its objects in memory and wakes the controller's loop
//! at every change (the Services', the EndpointSlices' and the pools', and the Gateway API's).

use crate::metrics::Metrics;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use std::sync::Arc;
use tokio::sync::Notify;

/// An object's creationTimestamp as text (RFC 3339: sorts as time; empty when unset).
pub fn created(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    m.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default()
}

/// Seconds a watch lasts before the server ends it and it starts again (under the client's
/// read deadline).
pub const WATCH_SECONDS: u32 = 45;

pub fn spawn_reflector<K>(w: reflector::store::Writer<K>, api: Api<K>, wc: watcher::Config, notify: Arc<Notify>, metrics: Arc<Metrics>)
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    tokio::spawn(async move {
        let stream = reflector(w, watcher(api, wc)).default_backoff();
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(_) => notify.notify_one(),
                Err(e) => {
                    metrics.watch_error();
                    tracing::warn!(kind = %K::kind(&()), error = %e, "watch failed; retrying");
                }
            }
        }
    });
}
