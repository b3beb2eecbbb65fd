"""The sharded parameter server over plain TCP: framing and admission, the server, PSP's partial rounds and SpecSync's scheduler."""
