//! Property: for any sequence of commands (some of them no-ops or
//! failures), a subscriber at any earlier epoch that replays the catch-up
//! incrementals ends with exactly the store's current state, and a store
//! reopened from disk holds the same state.

use cairn_mon::store::{open_db, Catchup, StateMachineStore};
use cairn_mon::{CmdOutput, MapState, MonRaftConfig, Proposal};
use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Kv {
    epoch: u64,
    values: BTreeMap<u8, u8>,
}

impl MapState for Kv {
    fn genesis(_: &[u8]) -> Result<Self, String> {
        Ok(Kv {
            epoch: 1,
            values: BTreeMap::new(),
        })
    }
    fn apply_command(&mut self, b: &[u8]) -> Result<CmdOutput, String> {
        match b {
            [k, v] if *v == 0 => Err(format!("refused {k}")),
            [k, v] => {
                if self.values.insert(*k, *v) != Some(*v) {
                    self.epoch += 1;
                }
                Ok(CmdOutput::default())
            }
            _ => Err("bad".into()),
        }
    }
    fn epoch(&self) -> u64 {
        self.epoch
    }
    fn encode_state(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap()
    }
    fn decode_state(b: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(b).map_err(|e| e.to_string())
    }
}

fn entry(index: u64, p: Proposal) -> Entry<MonRaftConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 0), index),
        payload: EntryPayload::Normal(p),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn incrementals_replay_to_the_same_state(cmds in proptest::collection::vec((0u8..6, 0u8..4), 1..60)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let tmp = tempfile::tempdir().unwrap();
            let db = open_db(tmp.path()).unwrap();
            let mut sm = StateMachineStore::<Kv>::open(db.clone()).unwrap();
            let mut entries = vec![entry(1, Proposal::Genesis(vec![]))];
            for (i, (k, v)) in cmds.iter().enumerate() {
                entries.push(entry(i as u64 + 2, Proposal::Command(vec![*k, *v])));
            }
            // Apply one by one, remembering the state at each epoch.
            let mut model = Kv::default();
            let mut at_epoch: BTreeMap<u64, Kv> = BTreeMap::new();
            for e in entries {
                let res = sm.apply(vec![e.clone()]).await.unwrap();
                match &e.payload {
                    EntryPayload::Normal(Proposal::Genesis(_)) => model = Kv::genesis(&[]).unwrap(),
                    EntryPayload::Normal(Proposal::Command(b)) => {
                        let mut next = model.clone();
                        if next.apply_command(b).is_ok() { model = next; }
                    }
                    _ => {}
                }
                prop_assert_eq!(res[0].epoch, model.epoch);
                at_epoch.insert(model.epoch, model.clone());
            }
            let final_epoch = model.epoch;
            for (have, state) in &at_epoch {
                let mut replay = state.clone();
                match sm.catchup(*have).unwrap() {
                    Catchup::UpToDate { epoch } => prop_assert_eq!(epoch, final_epoch),
                    Catchup::Incrementals { from, to, commands } => {
                        prop_assert_eq!((from, to), (*have, final_epoch));
                        for c in commands {
                            replay.apply_command(&c).unwrap();
                        }
                    }
                    other => prop_assert!(false, "unexpected {:?}", other),
                }
                prop_assert_eq!(&replay, &model);
            }
            drop(sm);
            let again = StateMachineStore::<Kv>::open(db).unwrap();
            let state = again.shared().read().unwrap().state.clone();
            prop_assert_eq!(state, Some(model));
            Ok(())
        })?;
    }
}
