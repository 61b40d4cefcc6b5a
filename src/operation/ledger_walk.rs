//! Reading the KV ledger page by page from a cursor: the position a reader resumes from
//! ([`LedgerCursor`]), a listed page ([`ListedPage`]), and the walk over pages that the
//! operator's listing and bulk actions share ([`LedgerWalk`]).
//!
//! Guarantees: a walk hands out each listed entry after its cursor once, in KV's order; it
//! lists at most its number of pages; the cursor it answers resumes at the first entry not
//! yet passed (an entry handed out and not passed, because the reader stopped before it, is
//! handed out again by the walk that resumes), so no entry is skipped or answered twice across
//! a reader's requests. No I/O: the edge lists each page the walk asks for.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where a reader of the ledger resumes: KV's page cursor, and the last entry done on that
/// page (KV lists in key order, so an entry at or before it is skipped).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerCursor {
    pub cursor: Option<String>,
    pub after_key: Option<String>,
}

impl LedgerCursor {
    /// True for an entry of the resumed page that was already done (at or before `after_key`).
    pub fn already_done(&self, entry: &str) -> bool {
        matches!(self.after_key.as_deref(), Some(after) if entry <= after)
    }
}

/// One KV list page.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListedPage {
    pub keys: Vec<ListedKey>,
    pub cursor: Option<String>,
    pub list_complete: bool,
}

/// One listed key and its metadata as KV holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedKey {
    pub name: String,
    pub metadata: Option<Value>,
}

/// What a walk needs next.
#[derive(Debug, Clone, PartialEq)]
pub enum WalkStep {
    /// List the page after this KV cursor, then hand it to [`LedgerWalk::on_page`].
    List { cursor: Option<String> },
    /// The next entry: [`LedgerWalk::pass`] it to go on, or stop before it.
    Entry(ListedKey),
    /// Nothing more in this request: resume from the cursor, or `None` at the end of the ledger.
    End(Option<LedgerCursor>),
}

/// A walk over the ledger from a cursor, listing at most `max_pages` pages.
#[derive(Debug, Clone, Default)]
pub struct LedgerWalk {
    at: LedgerCursor,
    page: Option<ListedPage>,
    next_in_page: usize,
    pages: usize,
    max_pages: usize,
}

impl LedgerWalk {
    pub fn new(from: LedgerCursor, max_pages: usize) -> LedgerWalk {
        LedgerWalk {
            at: from,
            max_pages,
            ..LedgerWalk::default()
        }
    }

    /// The next thing to do. An entry handed out stays the walk's position until it is
    /// passed, so [`LedgerWalk::cursor`] resumes at it.
    pub fn step(&mut self) -> WalkStep {
        loop {
            let Some(page) = &self.page else {
                if self.pages >= self.max_pages {
                    return WalkStep::End(Some(self.at.clone()));
                }
                let cursor = self.at.cursor.clone();
                return WalkStep::List { cursor };
            };
            if let Some(entry) = page.keys.get(self.next_in_page) {
                if self.at.already_done(&entry.name) {
                    self.next_in_page += 1;
                    continue;
                }
                return WalkStep::Entry(entry.clone());
            }
            if page.list_complete || page.cursor.is_none() {
                return WalkStep::End(None);
            }
            self.at = LedgerCursor {
                cursor: page.cursor.clone(),
                after_key: None,
            };
            self.page = None;
        }
    }

    /// The page asked for by [`WalkStep::List`].
    pub fn on_page(&mut self, page: ListedPage) {
        self.pages += 1;
        self.next_in_page = 0;
        self.page = Some(page);
    }

    /// Moves past the entry last handed out.
    pub fn pass(&mut self) {
        let page = self.page.as_ref();
        if let Some(entry) = page.and_then(|p| p.keys.get(self.next_in_page)) {
            self.at.after_key = Some(entry.name.clone());
            self.next_in_page += 1;
        }
    }

    /// Where a request that stops now resumes: at the entry in hand, if it was not passed.
    pub fn cursor(&self) -> LedgerCursor {
        self.at.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(names: &[&str], cursor: Option<&str>) -> ListedPage {
        ListedPage {
            keys: names
                .iter()
                .map(|n| ListedKey {
                    name: n.to_string(),
                    metadata: None,
                })
                .collect(),
            cursor: cursor.map(str::to_string),
            list_complete: cursor.is_none(),
        }
    }

    /// Walks with `pages` as KV's answers (by the cursor asked for), passing every entry
    /// until `stop` entries were passed; the names passed, the lists made and the end.
    fn walk(
        from: LedgerCursor,
        max_pages: usize,
        stop: usize,
        pages: &[(Option<&str>, ListedPage)],
    ) -> (Vec<String>, usize, Option<LedgerCursor>) {
        let mut w = LedgerWalk::new(from, max_pages);
        let (mut passed, mut lists) = (Vec::new(), 0);
        loop {
            match w.step() {
                WalkStep::List { cursor } => {
                    lists += 1;
                    let (_, p) = pages
                        .iter()
                        .find(|(c, _)| c.map(str::to_string) == cursor)
                        .expect("a page for the cursor asked");
                    w.on_page(p.clone());
                }
                WalkStep::Entry(e) if passed.len() == stop => {
                    assert!(!passed.contains(&e.name));
                    return (passed, lists, Some(w.cursor()));
                }
                WalkStep::Entry(e) => {
                    passed.push(e.name);
                    w.pass();
                }
                WalkStep::End(end) => return (passed, lists, end),
            }
        }
    }

    fn two_pages() -> Vec<(Option<&'static str>, ListedPage)> {
        vec![
            (None, page(&["op:a", "op:b"], Some("c1"))),
            (Some("c1"), page(&["op:c", "op:d"], None)),
        ]
    }

    #[test]
    fn a_walk_hands_out_every_entry_once_across_pages_and_ends_at_the_end() {
        let (passed, lists, end) = walk(LedgerCursor::default(), 5, usize::MAX, &two_pages());
        assert_eq!(passed, ["op:a", "op:b", "op:c", "op:d"]);
        assert_eq!((lists, end), (2, None));
    }

    #[test]
    fn a_reader_that_stops_before_an_entry_resumes_at_it() {
        let (first, _, end) = walk(LedgerCursor::default(), 5, 3, &two_pages());
        assert_eq!(first, ["op:a", "op:b", "op:c"]);
        let resume = end.expect("a cursor");
        assert_eq!(resume.cursor.as_deref(), Some("c1"));
        assert_eq!(resume.after_key.as_deref(), Some("op:c"));
        let (rest, _, end) = walk(resume, 5, usize::MAX, &two_pages());
        assert_eq!((rest, end), (vec!["op:d".to_string()], None));
    }

    #[test]
    fn a_walk_lists_at_most_its_pages_and_answers_where_to_go_on() {
        let (passed, lists, end) = walk(LedgerCursor::default(), 1, usize::MAX, &two_pages());
        assert_eq!((passed.len(), lists), (2, 1));
        assert_eq!(
            end,
            Some(LedgerCursor {
                cursor: Some("c1".into()),
                after_key: None
            })
        );
    }

    #[test]
    fn entries_at_or_before_the_cursor_are_skipped() {
        let from = LedgerCursor {
            cursor: None,
            after_key: Some("op:a".into()),
        };
        assert!(from.already_done("op:a") && !from.already_done("op:b"));
        let (passed, _, _) = walk(from, 5, usize::MAX, &two_pages());
        assert_eq!(passed, ["op:b", "op:c", "op:d"]);
    }
}
