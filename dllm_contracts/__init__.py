"""The contracts between the engine, the gateway and the operator: the Redis queue protocol (keys, Lua
scripts, messages, clients), the model families and the decoding each starts from, the scheduler config the
operator renders, the profile summary, model sources and the shipped models, the environment names.
Torch-free; imports nothing of engine_pod, gateway or the operator."""
