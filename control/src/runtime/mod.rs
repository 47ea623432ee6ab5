//! The agent's runtime: the state a running agent keeps and what it serves from it.
//!
//! - [`shared`]: what the event loop, reloads and HTTP handlers share, behind one lock.
//! - [`state`]: the lock and the record of host changes that a start after `kill -9` undoes.
//! - [`health`]: `/healthz` and `/readyz` from the kernel's real state; the systemd watchdog.
//! - [`events`]: the structured event log (`/events`, `paceline events`).
//! - [`history`]: the policies applied, and rollback to one of them.
//! - [`trace`]: a `paceline trace` session: the datapath's records, named, to the reader.
//! - [`alerts`]: Alertmanager's webhook: alerts that roll this host back.
//! - [`auth`]: who may use the API: the bearer token in `--api-token-file`, and its refusals.
pub mod alerts;
pub mod auth;
pub mod events;
pub mod health;
pub mod history;
pub mod shared;
pub mod state;
pub mod trace;
