pub mod pjrt;
