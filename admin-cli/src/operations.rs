//! `cachectl health`, `backends`, `certificates` and `reload`.

use lacquer_admin::{
    format::duration,
    wire::{BackendAdmin, BackendList, BackendView, CertificateList, Health, Reloaded},
    AdminClient, AdminError,
};

use crate::{
    table::{render as table, Align},
    Output,
};

pub async fn health(client: &AdminClient, out: Output) -> Result<(), AdminError> {
    let health = client.health().await?;
    let addr = client.target().addr;
    out.show(&health, |h: &Health| {
        let mut text = format!(
            "{}: lacquerd {} at {addr}, up {}\n",
            h.status,
            h.version,
            duration(h.uptime_seconds)
        );
        for problem in &h.problems {
            text.push_str(&format!("  - {problem}\n"));
        }
        text
    });
    Ok(())
}

pub async fn backends(client: &AdminClient, out: Output) -> Result<(), AdminError> {
    let list = client.backends().await?;
    out.show(&list, render_backends);
    Ok(())
}

/// `sick`, `healthy` or `auto`, as the API spells them.
pub fn admin_state(text: &str) -> Result<BackendAdmin, String> {
    [
        BackendAdmin::Sick,
        BackendAdmin::Healthy,
        BackendAdmin::Auto,
    ]
    .into_iter()
    .find(|a| a.as_str() == text)
    .ok_or_else(|| format!("give sick, healthy or auto, not {text:?}"))
}

pub async fn set_backend_health(
    client: &AdminClient,
    out: Output,
    name: &str,
    health: BackendAdmin,
) -> Result<(), AdminError> {
    let view = client.set_backend_health(name, health).await?;
    out.show(&view, render_set_health);
    Ok(())
}

fn render_set_health(b: &BackendView) -> String {
    let verdict = match &b.probe {
        Some(p) if p.healthy => "its probe says healthy",
        Some(_) => "its probe says sick",
        None => "it has no probe",
    };
    match b.admin {
        BackendAdmin::Auto => format!("backend {}: {} ({verdict})\n", b.name, b.health.as_str()),
        forced => format!(
            "backend {}: forced {} ({verdict}; `cachectl backend {} auto` hands it back)\n",
            b.name,
            forced.as_str(),
            b.name
        ),
    }
}

fn render_backends(list: &BackendList) -> String {
    let rows: Vec<Vec<String>> = list
        .backends
        .iter()
        .map(|b| {
            vec![
                b.name.clone(),
                b.address.clone(),
                b.health.as_str().into(),
                b.admin.as_str().into(),
                b.probe.as_ref().map_or_else(
                    || "-".into(),
                    |p| format!("{} {}/{}", p.history, p.good, p.window),
                ),
                b.requests.to_string(),
                b.errors.to_string(),
                b.consecutive_failures.to_string(),
                b.connections.to_string(),
                b.streams_reset.to_string(),
                b.last_error
                    .as_ref()
                    .map_or_else(|| "-".into(), |e| e.message.clone()),
            ]
        })
        .collect();
    table(
        &[
            ("NAME", Align::Left),
            ("ADDRESS", Align::Left),
            ("HEALTH", Align::Left),
            ("ADMIN", Align::Left),
            ("PROBE", Align::Left),
            ("REQUESTS", Align::Right),
            ("ERRORS", Align::Right),
            ("FAILING", Align::Right),
            ("CONNS", Align::Right),
            ("RESETS", Align::Right),
            ("LAST ERROR", Align::Left),
        ],
        &rows,
    )
}

pub async fn certificates(
    client: &AdminClient,
    out: Output,
    renew: bool,
) -> Result<(), AdminError> {
    let list = if renew {
        client.renew_certificates().await?
    } else {
        client.certificates().await?
    };
    out.show(&list, render_certificates);
    Ok(())
}

fn render_certificates(list: &CertificateList) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let rows: Vec<Vec<String>> = list
        .certificates
        .iter()
        .map(|c| {
            let (serial, expires) = match &c.held {
                Some(h) if h.not_after > now => (
                    h.serial.clone(),
                    format!("in {}", duration(h.not_after - now)),
                ),
                Some(h) => (h.serial.clone(), "expired".into()),
                None => ("-".into(), "-".into()),
            };
            vec![
                c.domains.join(","),
                c.listeners.join(","),
                c.challenge.clone(),
                serial,
                expires,
                c.next_attempt.map_or_else(
                    || "ordering".into(),
                    |t| {
                        if t > now {
                            format!("in {}", duration(t - now))
                        } else {
                            "now".into()
                        }
                    },
                ),
                format!("{}/{}", c.orders_succeeded, c.orders_failed),
                c.last_error.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    table(
        &[
            ("DOMAINS", Align::Left),
            ("LISTENERS", Align::Left),
            ("CHALLENGE", Align::Left),
            ("SERIAL", Align::Left),
            ("EXPIRES", Align::Left),
            ("NEXT ORDER", Align::Left),
            ("OK/FAILED", Align::Right),
            ("LAST ERROR", Align::Left),
        ],
        &rows,
    )
}

pub async fn reload(client: &AdminClient, out: Output) -> Result<(), AdminError> {
    let reloaded = client.reload().await?;
    out.show(&reloaded, render_reload);
    Ok(())
}

fn render_reload(r: &Reloaded) -> String {
    let file = r
        .config_file
        .as_deref()
        .unwrap_or("flags and defaults (no config file)");
    let mut out = if r.applied.is_empty() && r.not_applied.is_empty() {
        format!("reloaded {file}: nothing changed\n")
    } else {
        format!("reloaded {file}\n")
    };
    for setting in &r.applied {
        out += &format!("  applied      {setting}\n");
    }
    for n in &r.not_applied {
        out += &format!("  not applied  {} ({})\n", n.setting, n.reason);
    }
    out
}

#[cfg(test)]
mod tests {
    use lacquer_admin::wire::NotApplied;

    use super::*;

    #[test]
    fn reload_lists_what_changed() {
        let r = Reloaded {
            config_file: Some("/etc/lacquer/lacquer.toml".into()),
            applied: vec!["cache.default_ttl".into()],
            not_applied: vec![NotApplied {
                setting: "storage.memory".into(),
                reason: "takes effect on restart".into(),
            }],
        };
        assert_eq!(
            render_reload(&r),
            "reloaded /etc/lacquer/lacquer.toml\n  applied      cache.default_ttl\n  not applied  storage.memory (takes effect on restart)\n"
        );
    }
}
