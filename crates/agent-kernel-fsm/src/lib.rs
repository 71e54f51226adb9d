//! The agent-kernel FSM guardrail: a deterministic state machine that decides which event may
//! move a saga to which state, and which tool may execute in which state.
//!
//! An agent must not be able to call a mutating tool while validating, keep executing during
//! a rollback, or invent a transition from a prompt.
//! [`Guardrail`] holds a transition table (spec §3.4: [`Guardrail::builtin`], or a file
//! read with [`Guardrail::from_toml_str`]) and answers three questions:
//!
//! - [`Guardrail::can_transition`] / [`Guardrail::apply`]: may `event` happen in `state`,
//!   and where does it lead? Anything not in the table is denied (default deny); terminal
//!   states absorb every event.
//! - [`Guardrail::may_execute`]: may a tool of this effect class run in this state? Only
//!   read-only tools in `Planning` and `Validating`, nothing in `Compensating` or a terminal
//!   state (spec §3.5 rules 2 and 3).
//!
//! # Design
//!
//! - **Pure.** No I/O, no clock, no randomness: every answer depends on the table and the
//!   arguments only. Reading `fsm.toml` from disk is the caller's business.
//! - **Guards are inputs.** The conditions of the table (`Done` only when every step
//!   committed, `Validating` only when validation comes next, …) are [`Guard`]s whose truth
//!   the caller passes in [`Facts`]; the machine never looks anything up.
//! - **Immutable.** A `Guardrail` cannot gain a transition after it is built; a custom table
//!   is only what a file says, and loading validates it (every problem reported with its
//!   line), including that a failure can always be rolled back.
//!
//! # Example
//!
//! ```
//! use agent_kernel_api::{EffectClass, SagaState};
//! use agent_kernel_fsm::{Event, Facts, Guardrail};
//!
//! # fn main() -> Result<(), agent_kernel_fsm::Denial> {
//! let fsm = Guardrail::builtin();
//! let facts = Facts { actor_idle: true, plan_non_empty: true, ..Facts::default() };
//! let planning = fsm.apply(SagaState::Idle, Event::StartSaga, &facts)?;
//! let acting = fsm.apply(planning, Event::PlanReady, &facts)?;
//! assert_eq!(acting, SagaState::Acting);
//!
//! // A mutating tool may run while acting, not while validating.
//! assert!(fsm.may_execute(SagaState::Acting, EffectClass::Mutating).is_ok());
//! let denial = fsm
//!     .may_execute(SagaState::Validating, EffectClass::Mutating)
//!     .expect_err("a mutating tool may not run while validating");
//! assert!(denial.to_string().contains("only read-only tools"));
//!
//! // `Done` is reached only when the saga is complete, and it absorbs everything.
//! assert!(!fsm.can_transition(SagaState::Validating, Event::ValidationPassed, &Facts::default()));
//! assert!(fsm.apply(SagaState::Done, Event::ToolFailed, &facts).is_err());
//! # Ok(()) }
//! ```
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod guardrail;
mod model;
mod table;

pub use guardrail::{Denial, Guardrail, Rule};
pub use model::{Event, Facts, Guard, Transition};
pub use table::{MAX_TABLE_BYTES, MAX_TRANSITIONS, OPTIONAL_STATES, Problem, TableError};
