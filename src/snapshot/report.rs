//! What `pkgfs status SOCKET` says of a running `pkgfs snapshotter`: every snapshot, and
//! for each layer how it came to be: read lazily (from which image and layer) or
//! unpacked by containerd (and why not lazily). A silent fallback to unpacking is what
//! users of lazy snapshotters complain of most; this is where it is not silent.
//!
//! The facts are the snapshots' own labels ([`remote::REMOTE`] and
//! `remote/pkgfs.*` on a layer read lazily, [`remote::UNPACKED`] on one that was not),
//! so the report is the same after a restart.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::{Info, Kind, Snapshotter, remote};
use crate::status::Style;

/// Rows listed in the text summary (all with [`Style::All`]).
const LISTED: usize = 20;

/// Why a layer committed without being asked for by name was unpacked.
const NOT_ASKED: &str = "the client asked for no layer by name (a plain `ctr images pull` or \
                         an import; lazy pulls come from CRI, nerdctl or `ctr-remote images rpull`)";

/// How a snapshot came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum How {
    /// A layer read lazily from a registry.
    Lazy,
    /// A layer containerd unpacked.
    Unpacked,
    /// A writable snapshot (a container's root, a layer being unpacked).
    Active,
    /// A read-only view.
    View,
}

#[derive(Debug, Serialize)]
struct Row {
    name: String,
    parent: String,
    how: How,
    /// The image a lazy layer is read from.
    #[serde(skip_serializing_if = "Option::is_none")]
    reference: Option<String>,
    /// The lazy layer's digest.
    #[serde(skip_serializing_if = "Option::is_none")]
    digest: Option<String>,
    /// Why an unpacked layer was not read lazily.
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<String>,
}

impl Row {
    fn of(i: Info) -> Row {
        let label = |k: &str| i.labels.get(k).cloned();
        let how = match i.kind {
            Kind::Active => How::Active,
            Kind::View => How::View,
            Kind::Committed if i.labels.contains_key(remote::REMOTE) => How::Lazy,
            Kind::Committed => How::Unpacked,
        };
        let why = match how {
            How::Unpacked => Some(label(remote::UNPACKED).unwrap_or_else(|| NOT_ASKED.into())),
            _ => None,
        };
        Row {
            reference: label(remote::PKGFS_REFERENCE),
            digest: label(remote::PKGFS_DIGEST),
            why,
            how,
            name: i.name,
            parent: i.parent,
        }
    }
}

#[derive(Debug, Serialize)]
struct Report {
    socket: String,
    pid: u32,
    root: String,
    /// The `pkgfs store` layers are read from (`--store`), if any.
    store: Option<String>,
    lazy: usize,
    unpacked: usize,
    snapshots: Vec<Row>,
}

/// The report of `s`, serving on `socket`, reading layers from `store`.
pub fn report(s: &Snapshotter, socket: &Path, store: Option<&Path>, style: Style) -> String {
    let rows: Vec<Row> = match s.list::<&str>(&[]) {
        Ok(all) => all.into_iter().map(Row::of).collect(),
        Err(e) => return format!("error: the snapshots cannot be listed: {e}\n"),
    };
    let count = |h: How| rows.iter().filter(|r| r.how == h).count();
    let r = Report {
        socket: socket.display().to_string(),
        pid: std::process::id(),
        root: s.root().display().to_string(),
        store: store.map(|p| p.display().to_string()),
        lazy: count(How::Lazy),
        unpacked: count(How::Unpacked),
        snapshots: rows,
    };
    match style {
        Style::Json => serde_json::to_string_pretty(&r)
            .map(|j| j + "\n")
            .unwrap_or_else(|e| format!("error: {e}\n")),
        Style::Summary | Style::All => text(&r, style == Style::All),
    }
}

fn text(r: &Report, all: bool) -> String {
    let mut o = String::new();
    let count = |h: How| r.snapshots.iter().filter(|s| s.how == h).count();
    let _ = writeln!(o, "pkgfs snapshotter at {} (pid {})", r.socket, r.pid);
    let _ = writeln!(o, "root: {}", r.root);
    let _ = match &r.store {
        Some(s) => writeln!(o, "layers from: the pkgfs store at {s}"),
        None => writeln!(
            o,
            "layers from: nowhere (no --store): containerd unpacks each"
        ),
    };
    let _ = writeln!(
        o,
        "snapshots: {} ({} layers read lazily, {} unpacked, {} active, {} views)",
        r.snapshots.len(),
        r.lazy,
        r.unpacked,
        count(How::Active),
        count(How::View)
    );
    // Layers first (the lazy and unpacked ones, what users ask about), then the rest.
    let mut order: Vec<&Row> = r.snapshots.iter().collect();
    order.sort_by_key(|s| match s.how {
        How::Unpacked => 0,
        How::Lazy => 1,
        _ => 2,
    });
    let shown = if all {
        order.len()
    } else {
        LISTED.min(order.len())
    };
    if shown > 0 {
        let _ = writeln!(o, "\n{:<9} {:<40} from / why", "how", "snapshot");
    }
    for s in &order[..shown] {
        let how = serde_json::to_value(s.how)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let detail = match s.how {
            How::Lazy => format!(
                "{} {}",
                s.reference.as_deref().unwrap_or("?"),
                s.digest.as_deref().unwrap_or("?")
            ),
            How::Unpacked => s.why.clone().unwrap_or_default(),
            _ if s.parent.is_empty() => String::new(),
            _ => format!("on {}", s.parent),
        };
        let _ = writeln!(o, "{how:<9} {:<40} {detail}", s.name);
    }
    if shown < order.len() {
        let _ = writeln!(
            o,
            "… and {} more (pkgfs status --packages lists all)",
            order.len() - shown
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::Labels;
    use crate::snapshot::remote::{LayerRequest, LayerSource, Provided};

    /// Provides the layers whose digest label says `lazy`.
    struct Half;

    impl LayerSource for Half {
        fn provide(&self, req: &LayerRequest<'_>, _fs: &Path) -> super::super::Result<Provided> {
            match req.labels.get(remote::LAYER_DIGEST).map(String::as_str) {
                Some("sha256:lazy") => Ok(Provided::Yes(Labels::from([
                    (remote::REMOTE.to_string(), "remote snapshot".to_string()),
                    (remote::PKGFS_REFERENCE.to_string(), "r/img:1".to_string()),
                    (remote::PKGFS_DIGEST.to_string(), "sha256:lazy".to_string()),
                ]))),
                _ => Ok(Provided::No("not in the store".into())),
            }
        }
    }

    #[test]
    fn each_layer_says_whether_it_is_lazy_or_why_it_was_unpacked() {
        let d = tempfile::tempdir().unwrap();
        let s = Snapshotter::with_source(d.path(), Box::new(Half)).unwrap();
        let layer = |digest: &str, target: &str| {
            Labels::from([
                (remote::TARGET.to_string(), target.to_string()),
                (remote::IMAGE_REF.to_string(), "r/img:1".to_string()),
                (remote::LAYER_DIGEST.to_string(), digest.to_string()),
            ])
        };
        assert!(s.prepare("x1", "", layer("sha256:lazy", "c1")).is_err());
        s.prepare("x2", "c1", layer("sha256:other", "c2")).unwrap();
        // containerd unpacks and commits with its own labels: the reason stays.
        s.commit("c2", "x2", Labels::new()).unwrap();
        s.prepare("ctr", "c2", Labels::new()).unwrap();
        // Committed with no layer asked for: unpacked, and said so.
        s.prepare("x3", "c2", Labels::new()).unwrap();
        s.commit("c3", "x3", Labels::new()).unwrap();
        let json: serde_json::Value = serde_json::from_str(&report(
            &s,
            Path::new("/run/s.sock"),
            Some(Path::new("/store")),
            Style::Json,
        ))
        .unwrap();
        assert_eq!(json["lazy"], 1, "{json}");
        assert_eq!(json["unpacked"], 2, "{json}");
        let rows = json["snapshots"].as_array().unwrap();
        let row = |name: &str| rows.iter().find(|r| r["name"] == name).unwrap().clone();
        assert_eq!(row("c1")["how"], "lazy");
        assert_eq!(row("c1")["reference"], "r/img:1");
        assert_eq!(row("c1")["digest"], "sha256:lazy");
        assert_eq!(row("c2")["how"], "unpacked");
        assert_eq!(row("c2")["why"], "not in the store");
        assert_eq!(row("ctr")["how"], "active");
        assert_eq!(row("c3")["how"], "unpacked");
        assert_eq!(row("c3")["why"], NOT_ASKED);
        let text = report(&s, Path::new("/run/s.sock"), None, Style::Summary);
        assert!(text.contains("1 layers read lazily, 2 unpacked"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("unpacked") && l.ends_with("not in the store")),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("lazy") && l.ends_with("r/img:1 sha256:lazy")),
            "{text}"
        );
        assert!(text.contains("no --store"), "{text}");
    }
}
