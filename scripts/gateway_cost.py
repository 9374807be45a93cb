"""The serving path's CPU per request with the engine taken out (see engine_pod/bench/gateway_cost.py).

PYTHONPATH=. python scripts/gateway_cost.py [--requests 512] [--bursts 7] [--kinds chat,chat-stream]
"""

from engine_pod.bench.gateway_cost import main

if __name__ == "__main__":
    main()
