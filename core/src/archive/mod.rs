//! Validation of image archives (Docker v1.1/v1.2, OCI image layout v1),
//! as a sans-IO machine fed with bytes (issue 5).
