//! The gRPC face of the [`Snapshotter`]: containerd's `Snapshots` service, each method a
//! translation of its request, one call into the snapshotter on a blocking thread (the
//! store and the disk block), and a translation back.
//!
//! Errors become the status codes containerd's `errdefs.FromGRPC` turns back into its
//! error classes ([`status`]: the one table); the gRPC `snapshotter` field of each
//! request is ignored (this process serves one snapshotter), and so is containerd's
//! namespace header: the keys containerd sends are already namespaced by its own
//! metadata layer (`NAMESPACE/N/KEY`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tonic::{Code, Request, Response, Status};

use super::api::Mount as ApiMount;
use super::api::snapshots as pb;
use super::api::snapshots::snapshots_server::Snapshots;
use super::meta::Error;
use super::{Info, Kind, Labels, Mount, Snapshotter};

/// Infos per List message (containerd's own service sends 100 at a time).
pub const LIST_CHUNK: usize = 100;

/// The service: a shared [`Snapshotter`].
#[derive(Clone)]
pub struct Service {
    inner: Arc<Snapshotter>,
}

impl Service {
    /// Serve `snapshotter`.
    pub fn new(snapshotter: Arc<Snapshotter>) -> Service {
        Service { inner: snapshotter }
    }

    /// Run `f` on a blocking thread; its error as a status.
    async fn call<T, F>(&self, what: &'static str, f: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Snapshotter) -> Result<T, Error> + Send + 'static,
    {
        let s = self.inner.clone();
        match tokio::task::spawn_blocking(move || f(&s)).await {
            Ok(r) => r.map_err(|e| status(what, e)),
            Err(e) => {
                log::error!("{what}: {e}");
                Err(Status::internal(format!("{what}: {e}")))
            }
        }
    }
}

/// The status containerd understands for `e`: `NotFound`, `AlreadyExists`,
/// `FailedPrecondition`, `InvalidArgument`; anything else is `Unknown` (as containerd's
/// `errdefs.ToGRPC` answers errors of no class), and logged.
pub fn status(what: &str, e: Error) -> Status {
    let code = match &e {
        Error::NotFound(_) => Code::NotFound,
        Error::AlreadyExists(_) => Code::AlreadyExists,
        Error::FailedPrecondition(_) => Code::FailedPrecondition,
        Error::InvalidArgument(_) | Error::Filter(_) => Code::InvalidArgument,
        _ => Code::Unknown,
    };
    if code == Code::Unknown {
        log::warn!("{what}: {e}");
    } else {
        // Answers containerd expects in its normal course (a layer already there).
        log::debug!("{what}: {e}");
    }
    Status::new(code, e.to_string())
}

fn labels(m: HashMap<String, String>) -> Labels {
    m.into_iter().collect()
}

fn mounts(ms: Vec<Mount>) -> Vec<ApiMount> {
    ms.into_iter()
        .map(|m| ApiMount {
            r#type: m.kind,
            source: m.source,
            target: String::new(),
            options: m.options,
        })
        .collect()
}

fn kind(k: Kind) -> pb::Kind {
    match k {
        Kind::View => pb::Kind::View,
        Kind::Active => pb::Kind::Active,
        Kind::Committed => pb::Kind::Committed,
    }
}

fn info(i: Info) -> pb::Info {
    pb::Info {
        name: i.name,
        parent: i.parent,
        kind: kind(i.kind) as i32,
        created_at: Some(i.created.into()),
        updated_at: Some(i.updated.into()),
        labels: i.labels.into_iter().collect(),
    }
}

/// An Update's info as the store takes it (only name and labels are read).
fn update_info(i: pb::Info) -> Info {
    Info {
        name: i.name,
        parent: i.parent,
        kind: Kind::Active,
        labels: i.labels.into_iter().collect::<BTreeMap<_, _>>(),
        created: std::time::UNIX_EPOCH,
        updated: std::time::UNIX_EPOCH,
    }
}

#[tonic::async_trait]
impl Snapshots for Service {
    async fn prepare(
        &self,
        req: Request<pb::PrepareSnapshotRequest>,
    ) -> Result<Response<pb::PrepareSnapshotResponse>, Status> {
        let r = req.into_inner();
        let m = self
            .call("prepare", move |s| {
                s.prepare(&r.key, &r.parent, labels(r.labels))
            })
            .await?;
        Ok(Response::new(pb::PrepareSnapshotResponse {
            mounts: mounts(m),
        }))
    }

    async fn view(
        &self,
        req: Request<pb::ViewSnapshotRequest>,
    ) -> Result<Response<pb::ViewSnapshotResponse>, Status> {
        let r = req.into_inner();
        let m = self
            .call("view", move |s| s.view(&r.key, &r.parent, labels(r.labels)))
            .await?;
        Ok(Response::new(pb::ViewSnapshotResponse {
            mounts: mounts(m),
        }))
    }

    async fn mounts(
        &self,
        req: Request<pb::MountsRequest>,
    ) -> Result<Response<pb::MountsResponse>, Status> {
        let r = req.into_inner();
        let m = self.call("mounts", move |s| s.mounts(&r.key)).await?;
        Ok(Response::new(pb::MountsResponse { mounts: mounts(m) }))
    }

    async fn commit(
        &self,
        req: Request<pb::CommitSnapshotRequest>,
    ) -> Result<Response<()>, Status> {
        let r = req.into_inner();
        self.call("commit", move |s| {
            s.commit(&r.name, &r.key, labels(r.labels))
        })
        .await?;
        Ok(Response::new(()))
    }

    async fn remove(
        &self,
        req: Request<pb::RemoveSnapshotRequest>,
    ) -> Result<Response<()>, Status> {
        let r = req.into_inner();
        self.call("remove", move |s| s.remove(&r.key)).await?;
        Ok(Response::new(()))
    }

    async fn stat(
        &self,
        req: Request<pb::StatSnapshotRequest>,
    ) -> Result<Response<pb::StatSnapshotResponse>, Status> {
        let r = req.into_inner();
        let i = self.call("stat", move |s| s.stat(&r.key)).await?;
        Ok(Response::new(pb::StatSnapshotResponse {
            info: Some(info(i)),
        }))
    }

    async fn update(
        &self,
        req: Request<pb::UpdateSnapshotRequest>,
    ) -> Result<Response<pb::UpdateSnapshotResponse>, Status> {
        let r = req.into_inner();
        let Some(i) = r.info else {
            return Err(status(
                "update",
                Error::InvalidArgument("update without an info".into()),
            ));
        };
        let paths = r.update_mask.map(|m| m.paths).unwrap_or_default();
        let i = self
            .call("update", move |s| s.update(&update_info(i), &paths))
            .await?;
        Ok(Response::new(pb::UpdateSnapshotResponse {
            info: Some(info(i)),
        }))
    }

    type ListStream =
        tokio_stream::Iter<std::vec::IntoIter<Result<pb::ListSnapshotsResponse, Status>>>;

    async fn list(
        &self,
        req: Request<pb::ListSnapshotsRequest>,
    ) -> Result<Response<Self::ListStream>, Status> {
        let r = req.into_inner();
        let all = self.call("list", move |s| s.list(&r.filters)).await?;
        let mut messages = Vec::with_capacity(all.len().div_ceil(LIST_CHUNK));
        let mut infos = all.into_iter().map(info).peekable();
        while infos.peek().is_some() {
            messages.push(Ok(pb::ListSnapshotsResponse {
                info: infos.by_ref().take(LIST_CHUNK).collect(),
            }));
        }
        Ok(Response::new(tokio_stream::iter(messages)))
    }

    async fn usage(
        &self,
        req: Request<pb::UsageRequest>,
    ) -> Result<Response<pb::UsageResponse>, Status> {
        let r = req.into_inner();
        let u = self.call("usage", move |s| s.usage(&r.key)).await?;
        Ok(Response::new(pb::UsageResponse {
            size: u.size,
            inodes: u.inodes,
        }))
    }

    async fn cleanup(&self, _req: Request<pb::CleanupRequest>) -> Result<Response<()>, Status> {
        self.call("cleanup", |s| s.cleanup()).await?;
        Ok(Response::new(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    fn service() -> (tempfile::TempDir, Service) {
        let d = tempfile::tempdir().unwrap();
        let s = Snapshotter::open(d.path()).unwrap();
        (d, Service::new(Arc::new(s)))
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    #[test]
    fn errors_carry_containerds_codes() {
        let (_d, svc) = service();
        rt().block_on(async {
            let code =
                |r: Result<Response<pb::StatSnapshotResponse>, Status>| r.unwrap_err().code();
            let stat = |key: &str| {
                svc.stat(Request::new(pb::StatSnapshotRequest {
                    snapshotter: "pkgfs".into(),
                    key: key.into(),
                }))
            };
            assert_eq!(code(stat("missing").await), Code::NotFound);
            let prep = |key: &str, parent: &str| {
                svc.prepare(Request::new(pb::PrepareSnapshotRequest {
                    snapshotter: String::new(),
                    key: key.into(),
                    parent: parent.into(),
                    labels: HashMap::new(),
                }))
            };
            prep("a", "").await.unwrap();
            assert_eq!(prep("a", "").await.unwrap_err().code(), Code::AlreadyExists);
            assert_eq!(prep("b", "nope").await.unwrap_err().code(), Code::NotFound);
            assert_eq!(
                prep("b", "a").await.unwrap_err().code(),
                Code::InvalidArgument
            );
            let commit = |name: &str, key: &str| {
                svc.commit(Request::new(pb::CommitSnapshotRequest {
                    snapshotter: String::new(),
                    name: name.into(),
                    key: key.into(),
                    labels: HashMap::new(),
                }))
            };
            commit("layer", "a").await.unwrap();
            prep("c", "layer").await.unwrap();
            let rm = svc
                .remove(Request::new(pb::RemoveSnapshotRequest {
                    snapshotter: String::new(),
                    key: "layer".into(),
                }))
                .await;
            assert_eq!(rm.unwrap_err().code(), Code::FailedPrecondition);
            let i = stat("layer").await.unwrap().into_inner().info.unwrap();
            assert_eq!(i.kind, pb::Kind::Committed as i32);
            assert!(i.created_at.is_some() && i.updated_at.is_some());
            let up = svc
                .update(Request::new(pb::UpdateSnapshotRequest {
                    snapshotter: String::new(),
                    info: Some(pb::Info {
                        name: "layer".into(),
                        labels: HashMap::from([("k".into(), "v".into())]),
                        ..Default::default()
                    }),
                    update_mask: Some(prost_types::FieldMask {
                        paths: vec!["labels.k".into()],
                    }),
                }))
                .await
                .unwrap()
                .into_inner()
                .info
                .unwrap();
            assert_eq!(up.labels.get("k").map(String::as_str), Some("v"));
            assert_eq!(
                up.kind,
                pb::Kind::Committed as i32,
                "the stored kind, not the request's"
            );
        });
    }

    #[test]
    fn list_streams_chunks_of_at_most_a_hundred() {
        let (_d, svc) = service();
        for i in 0..250 {
            svc.inner
                .prepare(&format!("k{i:03}"), "", Labels::new())
                .unwrap();
        }
        rt().block_on(async {
            let list = |filters: Vec<String>| {
                svc.list(Request::new(pb::ListSnapshotsRequest {
                    snapshotter: String::new(),
                    filters,
                }))
            };
            let stream = list(vec![]).await.unwrap().into_inner();
            let sizes: Vec<usize> = stream.map(|m| m.unwrap().info.len()).collect().await;
            assert_eq!(sizes, [100, 100, 50]);
            let stream = list(vec!["name==k007".into(), "name==k200".into()])
                .await
                .unwrap()
                .into_inner();
            let names: Vec<String> = stream
                .map(|m| m.unwrap().info.into_iter().map(|i| i.name))
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .flatten()
                .collect();
            assert_eq!(names, ["k007", "k200"]);
            let bad = list(vec!["name=".into()]).await.unwrap_err();
            assert_eq!(bad.code(), Code::InvalidArgument);
            // No match: an empty stream.
            let stream = list(vec!["name==none".into()]).await.unwrap().into_inner();
            assert_eq!(stream.collect::<Vec<_>>().await.len(), 0);
        });
    }
}
