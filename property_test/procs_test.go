package property_test

const helperEnv = "REDSEM_PROPERTY_HELPER"
