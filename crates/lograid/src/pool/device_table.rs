//! The pool's open members by index. Every member read and write looks a
//! member up here, so a lookup takes no lock: the table is immutable behind
//! an atomic pointer (`arc_swap`) and is replaced whole when a member joins
//! or leaves (rare; those changes take turns under `changing`). The read
//! path borrows a member from the table for one member read (no reference
//! count touched); a member let go meanwhile stays open until that read is
//! done. `Engine::device` hands out a clone, for longer work.

use crate::device::Device;
use crate::sync::Mutex;
use arc_swap::{ArcSwap, Guard};
use std::sync::Arc;

/// Open members by index (None: missing, or removed).
pub(crate) type Devices = Vec<Option<Arc<Device>>>;

pub(crate) struct DeviceTable {
    current: ArcSwap<Devices>,
    changing: Mutex<()>,
}

impl DeviceTable {
    pub fn new(devices: Devices) -> DeviceTable {
        DeviceTable {
            current: ArcSwap::from_pointee(devices),
            changing: Mutex::new(()),
        }
    }

    /// The table as of now.
    pub fn load(&self) -> Guard<Arc<Devices>> {
        self.current.load()
    }

    /// Changes the table (a copy, put in place whole); returns what
    /// `change` returns.
    pub fn update<R>(&self, change: impl FnOnce(&mut Devices) -> R) -> R {
        let _turn = self.changing.lock();
        let mut next = Devices::clone(&self.current.load());
        let result = change(&mut next);
        self.current.store(Arc::new(next));
        result
    }
}
