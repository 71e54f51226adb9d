//! Integration tests of the example: real processes, real SIGKILLs.

mod crash;
