//! Which threads are the engine's own: the background scanner, the fault
//! thread, and a thread inside fork's prepare handler. A preload must not
//! route their allocations and copies back into the engine, whose lock they
//! may hold; every module that starts or marks such a thread sets the flag here.

thread_local! {
    pub(crate) static ENGINE_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// True on the engine's own threads (the background scanner). A preload
/// must not route their allocations and copies back into the engine, whose
/// lock they may hold.
pub fn on_engine_thread() -> bool {
    ENGINE_THREAD.with(|t| t.get())
}
