//! [`FaultTable`]: the [`Faults`] of a server whose knob takes the answer to
//! give (a status and an error code, or an error class), written as the
//! table of answers a provider's fixture declares.

use std::fmt;

use route_cloud::ErrorKind;

use crate::{Faults, Op};

/// One row: the answer that makes the provider report `kind` on `op`.
struct Row<A> {
    op: Op,
    kind: ErrorKind,
    answer: A,
}

/// A server's knob: answer the next request of the operation with this.
type Inject<A> = Box<dyn Fn(Op, &A) + Send + Sync>;

/// The fault knobs of a server, as a table: for each operation and error
/// class the answer its knob gives, and the knob itself. The pairs checked
/// are the rows, in the order they were added (the checks number their
/// destinations by it).
pub struct FaultTable<A> {
    rows: Vec<Row<A>>,
    inject: Inject<A>,
}

impl<A> fmt::Debug for FaultTable<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultTable")
            .field(
                "pairs",
                &self.rows.iter().map(|r| (r.op, r.kind)).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl<A> FaultTable<A> {
    /// An empty table whose knob is `inject`: it makes the server answer the
    /// next request of the operation with the answer given, without acting
    /// on the request.
    pub fn new(inject: impl Fn(Op, &A) + Send + Sync + 'static) -> Self {
        Self {
            rows: Vec::new(),
            inject: Box::new(inject),
        }
    }

    /// Answers on every operation, list, create then delete, each with all
    /// of `answers` in their order: the classes a cloud answers whatever the
    /// request.
    pub fn on_every_op(mut self, answers: impl IntoIterator<Item = (ErrorKind, A)>) -> Self
    where
        A: Clone,
    {
        let answers: Vec<(ErrorKind, A)> = answers.into_iter().collect();
        for op in [Op::List, Op::Create, Op::Delete] {
            for (kind, answer) in &answers {
                self.rows.push(Row {
                    op,
                    kind: *kind,
                    answer: answer.clone(),
                });
            }
        }
        self
    }

    /// Answers `answer` on `op` only, classified as `kind`: a class only
    /// that operation can meet (a full table on create, a route already
    /// gone on delete).
    pub fn on(mut self, op: Op, kind: ErrorKind, answer: A) -> Self {
        self.rows.push(Row { op, kind, answer });
        self
    }
}

impl<A: Send + Sync> Faults for FaultTable<A> {
    fn injectable(&self) -> Vec<(Op, ErrorKind)> {
        self.rows.iter().map(|r| (r.op, r.kind)).collect()
    }

    fn fail_next(&self, op: Op, kind: ErrorKind) {
        let row = self
            .rows
            .iter()
            .find(|r| r.op == op && r.kind == kind)
            .unwrap_or_else(|| panic!("the fault table has no answer for {kind} on {op}"));
        (self.inject)(op, &row.answer);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn pairs_come_in_the_order_added_and_each_injects_its_own_answer() {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&sent);
        let table = FaultTable::new(move |op, answer: &u16| {
            log.lock().unwrap().push((op, *answer));
        })
        .on(Op::List, ErrorKind::Timeout, 1)
        .on_every_op([(ErrorKind::Throttled, 429), (ErrorKind::Permanent, 403)])
        .on(Op::Create, ErrorKind::QuotaExceeded, 400);
        assert_eq!(
            table.injectable(),
            vec![
                (Op::List, ErrorKind::Timeout),
                (Op::List, ErrorKind::Throttled),
                (Op::List, ErrorKind::Permanent),
                (Op::Create, ErrorKind::Throttled),
                (Op::Create, ErrorKind::Permanent),
                (Op::Delete, ErrorKind::Throttled),
                (Op::Delete, ErrorKind::Permanent),
                (Op::Create, ErrorKind::QuotaExceeded),
            ]
        );
        table.fail_next(Op::Delete, ErrorKind::Permanent);
        table.fail_next(Op::Create, ErrorKind::QuotaExceeded);
        assert_eq!(
            *sent.lock().unwrap(),
            vec![(Op::Delete, 403), (Op::Create, 400)]
        );
    }

    #[test]
    #[should_panic(expected = "no answer for quota_exceeded on delete")]
    fn a_pair_not_in_the_table_is_refused() {
        FaultTable::new(|_, _: &u16| {})
            .on(Op::Create, ErrorKind::QuotaExceeded, 400)
            .fail_next(Op::Delete, ErrorKind::QuotaExceeded);
    }
}
