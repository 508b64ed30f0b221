"""The three families Set Diffusion interpolates between: AR, MDLM and BD3LM."""
