//! neuron-pc
