//! A saved session played back turn by turn with its recorded timing.

use std::collections::VecDeque;

use crate::session::{Session, Turn};
use deltascope_protocol::EngineEvent;

/// A session being replayed: items due at (ms since the replay started).
#[derive(Debug)]
pub struct Replay {
    pub started_ms: f64,
    pub queue: VecDeque<(f64, ReplayItem)>,
    /// When the turn being replayed began (replay time).
    pub turn_start: f64,
}

#[derive(Debug)]
// Items are moved once from the queue; boxing each event would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum ReplayItem {
    Begin(Box<Turn>),
    Event(EngineEvent),
}

impl Replay {
    /// The whole of `s` as a queue (half a second between turns).
    pub fn of(s: &Session, now_ms: f64) -> Replay {
        let mut queue = VecDeque::new();
        let mut offset = 0.0;
        for t in &s.turns {
            let mut skeleton = Turn::new(t.user.clone(), t.params.clone());
            skeleton.compare_of = t.compare_of;
            queue.push_back((offset, ReplayItem::Begin(Box::new(skeleton))));
            let events = t.replay_events();
            let end = events.last().map(|(ms, _)| *ms).unwrap_or(0.0);
            for (ms, e) in events {
                queue.push_back((offset + ms, ReplayItem::Event(e)));
            }
            offset += end + 500.0;
        }
        Replay { started_ms: now_ms, queue, turn_start: 0.0 }
    }

    /// Plays what is due at `now_ms` into `turns`; `true` when the replay is over.
    pub fn advance(&mut self, now_ms: f64, turns: &mut Vec<Turn>) -> bool {
        let elapsed = now_ms - self.started_ms;
        while self.queue.front().is_some_and(|(t, _)| *t <= elapsed) {
            let Some((at, item)) = self.queue.pop_front() else { break };
            match item {
                ReplayItem::Begin(turn) => {
                    self.turn_start = at;
                    turns.push(*turn);
                }
                ReplayItem::Event(e) => {
                    if let Some(t) = turns.last_mut() {
                        t.apply(&e, at - self.turn_start);
                    }
                }
            }
        }
        self.queue.is_empty()
    }
}
