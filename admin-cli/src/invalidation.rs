//! `cachectl ban`, `bans` and `purge`.

use lacquer_admin::{
    format::duration,
    wire::{BanList, PurgeTags, PurgeUrl, Purged},
    AdminClient, AdminError,
};

use crate::{
    table::{render as table, Align},
    Output,
};

pub async fn ban(client: &AdminClient, out: Output, expression: &str) -> Result<(), AdminError> {
    let ban = client.ban(expression).await?;
    out.show(&ban, |b| format!("ban {} added: {}\n", b.id, b.expression));
    Ok(())
}

pub async fn bans(client: &AdminClient, out: Output) -> Result<(), AdminError> {
    let list = client.bans().await?;
    out.show(&list, render_bans);
    Ok(())
}

fn render_bans(list: &BanList) -> String {
    if list.bans.is_empty() {
        return "no bans\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .bans
        .iter()
        .map(|b| {
            vec![
                b.id.to_string(),
                duration(b.age_seconds),
                match b.to_test {
                    Some(total) => format!("{} of {total}", b.tested),
                    None => b.tested.to_string(),
                },
                b.percent().map_or_else(|| "-".into(), |p| format!("{p} %")),
                b.removed.to_string(),
                if b.completed { "completed" } else { "pending" }.into(),
                b.expression.clone(),
            ]
        })
        .collect();
    table(
        &[
            ("ID", Align::Right),
            ("AGE", Align::Right),
            ("TESTED", Align::Right),
            ("DONE", Align::Right),
            ("REMOVED", Align::Right),
            ("STATE", Align::Left),
            ("EXPRESSION", Align::Left),
        ],
        &rows,
    )
}

pub async fn purge(
    client: &AdminClient,
    out: Output,
    url: Option<String>,
    host: Option<String>,
    tags: Vec<String>,
    soft: bool,
) -> Result<(), AdminError> {
    let (purged, what) = match url {
        Some(url) => {
            let what = match &host {
                Some(host) => format!("{url} on {host}"),
                None => url.clone(),
            };
            let purged = client.purge_url(&PurgeUrl { url, host, soft }).await?;
            (purged, what)
        }
        None => {
            let what = format!("tagged {}", tags.join(", "));
            (client.purge_tags(&PurgeTags { tags, soft }).await?, what)
        }
    };
    out.show(&purged, |p| describe(p, &what));
    Ok(())
}

fn describe(p: &Purged, what: &str) -> String {
    let verb = if p.soft { "soft-purged" } else { "purged" };
    let objects = if p.purged == 1 { "object" } else { "objects" };
    format!("{verb} {} {objects} {what}\n", p.purged)
}

#[cfg(test)]
mod tests {
    use lacquer_admin::wire::BanView;

    use super::*;

    #[test]
    fn ban_table_and_purge_lines() {
        let list = BanList {
            bans: vec![BanView {
                id: 7,
                expression: "req.url ~ \"^/a\"".into(),
                created: 0,
                age_seconds: 65,
                tested: 100,
                removed: 4,
                to_test: Some(100),
                completed: true,
            }],
        };
        assert_eq!(
            render_bans(&list),
            "ID    AGE      TESTED   DONE  REMOVED  STATE      EXPRESSION\n 7  1m 5s  100 of 100  100 %        4  completed  req.url ~ \"^/a\"\n"
        );
        let walking = |tested, to_test| BanView {
            tested,
            to_test,
            completed: false,
            ..list.bans[0].clone()
        };
        assert_eq!(walking(250, Some(1000)).percent(), Some(25));
        assert_eq!(
            walking(1200, Some(1000)).percent(),
            Some(99),
            "only the walk completes a ban"
        );
        assert_eq!(walking(5, None).percent(), None);
        assert_eq!(walking(0, Some(0)).percent(), None);
        let pending = render_bans(&BanList {
            bans: vec![walking(250, Some(1000)), walking(3, None)],
        });
        assert_eq!(
            pending,
            "ID    AGE       TESTED  DONE  REMOVED  STATE    EXPRESSION\n \
             7  1m 5s  250 of 1000  25 %        4  pending  req.url ~ \"^/a\"\n \
             7  1m 5s            3     -        4  pending  req.url ~ \"^/a\"\n"
        );
        assert_eq!(render_bans(&BanList { bans: vec![] }), "no bans\n");
        let p = Purged {
            purged: 1,
            soft: true,
        };
        assert_eq!(
            describe(&p, "http://a/b"),
            "soft-purged 1 object http://a/b\n"
        );
    }
}
