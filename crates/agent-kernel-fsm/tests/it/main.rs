//! Integration tests of the FSM guardrail.

mod deny;
mod execute;
mod props;
mod rows;
mod table;
