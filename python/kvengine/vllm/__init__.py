"""vLLM integration: KVEngineConnector (kvengine.vllm.connector).

Importing this package does not import vLLM or torch; the connector module imports vLLM's
base classes when vLLM is installed and the stand-ins of _vllm_compat otherwise.
"""
