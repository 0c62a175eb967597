package bulkhead.log_test

import data.system.log

test_last_applied_configuration_masked if {
	event := {"input": {"pod": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"}}}}
	log.mask == {"/input/pod/annotations/kubectl.kubernetes.io~1last-applied-configuration"} with input as event
}

test_secret_label_values_masked if {
	event := {"input": {"pod": {"labels": {"app": "x", "db/password": "hunter2"}}}}
	log.mask == {{"op": "upsert", "path": "/input/pod/labels/db~1password", "value": "**masked**"}} with input as event
}

test_plain_pod_unmasked if {
	count(log.mask) == 0 with input as {"input": {"pod": {"labels": {"app": "x"}}}}
}
