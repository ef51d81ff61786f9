"""Cost models for experiments: FLOPs of a training step (`flops`) and a roofline that adds bytes moved (`roofline`)."""
