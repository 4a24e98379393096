"""Pipeline parallelism across DeepSeek-V4.1's KV-sharing groups (docs/PIPELINE.md).

topology.py / plan.py: what each stage must receive (pure arithmetic on the config);
payload.py: packing it next to the IntermediateTensors and writing the replicas (torch only);
engine.py / dspark_embed.py: the binding-table wrappers that put it into vLLM 0.32.0.
"""
